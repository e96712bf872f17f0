"""What ``BertClient`` and ``AsyncBertClient`` are made with: their options, checked once.

:class:`BaseClient` takes the options both clients take, in the same signature, checks them
(:meth:`~bertserve.client.core.options.ClientOptions.checked`) before any socket is opened,
and keeps them with the client's :class:`~bertserve.client.core.base.ClientCore`; each client
then opens its connection its own way (:meth:`BaseClient._open`).
"""

from __future__ import annotations

import os
from typing import Literal

from ..security import KeySource
from .base import ClientCore
from .options import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_TIMEOUT_MS, ClientOptions


class BaseClient:
    """The options of a client of one bertserve server, as its class's docstring tells them."""

    def __init__(
        self,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        port_out: int | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_MS,
        output_fmt: Literal["ndarray", "list"] = "ndarray",
        identity: bytes | str | None = None,
        check_version: bool = True,
        check_length: bool = True,
        show_server_config: bool = False,
        server_key: KeySource | None = None,
        client_cert: str | os.PathLike[str] | None = None,
        model: str | None = None,
    ) -> None:
        options = ClientOptions.checked(
            host,
            port,
            port_out,
            timeout=timeout,
            output_fmt=output_fmt,
            identity=identity,
            check_version=check_version,
            check_length=check_length,
            show_server_config=show_server_config,
            server_key=server_key,
            client_cert=client_cert,
            model=model,
        )
        self.host, self.port, self.port_out = options.host, options.port, options.port_out
        self.output_fmt = options.output_fmt
        self.identity = options.identity
        self.check_version = options.check_version
        self.check_length = options.check_length
        self.show_server_config = options.show_server_config
        self.model = options.model
        self._core = ClientCore(options, type(self).__name__)
        self._address = self._core.address
        self._open()

    @property
    def timeout(self) -> float:
        """Milliseconds that a wait for the server may take (``BertClient``'s every wait,
        ``AsyncBertClient``'s each call's wait for its answer); may be changed between calls."""
        return self._core.timeout

    @timeout.setter
    def timeout(self, timeout: float) -> None:
        self._core.timeout = timeout

    def _open(self) -> None:
        """Make the client's connection, once its options are checked."""
        raise NotImplementedError
