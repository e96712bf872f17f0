"""A client's connection to one server: what it learnt on connecting, and requests whose
answers it awaits, each wait bounded by the timeout.

:meth:`Connection.handshake` asks for the configuration of the client's model, again every
0.2 s until an answer comes through: until the server's ``PUB`` has seen the client's
subscription (ZeroMQ's slow joiner), a reply published to it is silently lost. Unanswered at
first, it looks whether anything listens at all (:class:`~bertserve.client.probe.ServerProbe`):
a server on this machine that is not running raises :class:`NoServerError` within a second,
as does any server that does not answer the handshake within the timeout. Each request is
framed here, its header saying what it asks, and handed to the
:class:`~bertserve.client.transport.Transport`. A wait that runs out raises
:class:`AuthenticationError` if a handshake was refused, since then the server never saw the
client, and :class:`ServerTimeoutError` otherwise.

A server of several models has a configuration for each (its dimension, prompts, length);
the connection keeps each model's once asked (:meth:`Connection.config_of`), so the options
of a request are checked against the model it goes to.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._version import __version__
from .advice import PYTHON, Advice
from .errors import BertClientError, NoServerError, ProtocolVersionError, ServerTimeoutError
from .options import Curve, EncodeOptions, model_field
from .protocol import CONFIG, ENCODE, PROTOCOL_VERSION, Reply, encode_request
from .results import EncodeResult, answer, encode_result
from .transport import Transport

_HANDSHAKE_RESEND_S = 0.2


@dataclass
class Pending:
    """What becomes of the reply to a request someone will collect."""

    show_tokens: bool
    fetchable: bool  # sent with blocking=False, so fetch() hands it out


class Connection:
    """The sockets to the server at ``host`` (see :class:`Transport`), the configuration of
    ``model`` (``None``: the server's default) once :meth:`handshake` has asked for it, those
    of other models once asked, and ``timeout`` (milliseconds) bounding every wait."""

    def __init__(
        self,
        host: str,
        port: int,
        port_out: int,
        identity: bytes,
        curve: Curve | None,
        *,
        timeout: float,
        model: str | None = None,
    ) -> None:
        self.timeout = timeout
        self.port_out = port_out
        self.model = model
        self._configs: dict[str | None, dict[str, Any]] = {}  # by model name, None the server's default
        self.transport: Transport[Pending] = Transport(host, port, port_out, identity, curve)
        self.address = self.transport.address

    def deadline(self) -> float:
        """When a wait that starts now gives up."""
        return time.monotonic() + self.timeout / 1000

    # -- connecting --------------------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        """The configuration of the client's model, as the server last told it."""
        return self._configs.get(self.model, {})

    def handshake(self) -> dict[str, Any]:
        """Ask for the config of the client's model, re-asking until the subscription has
        reached the server's PUB socket and an answer comes through."""
        deadline = self.deadline()
        try:
            reply = self._first_answer(deadline)
        finally:
            self.transport.stop_probing()
        if not reply.ok and reply.header.get("kind") == "protocol":
            raise ProtocolVersionError(
                f"the server at {self.address} does not speak protocol {PROTOCOL_VERSION} "
                f"(bertserve client {__version__}): {reply.header.get('error')}"
            )
        self._configs[self.model] = answer(reply)
        self.transport.window.fit(self.config)  # as many requests in flight as the server queues replies
        return self.config

    def _first_answer(self, deadline: float) -> Reply:
        asked: set[int] = set()
        started = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    raise self.transport.refusal() or self._no_server(refused=False)
                asked.add(self.request(CONFIG, deadline, header=model_field(self.model)))
                reply = self.transport.await_any(asked, min(deadline, now + _HANDSHAKE_RESEND_S))
                if reply is not None:
                    asked.discard(reply.request_id)
                    return reply
                if (refused := self.transport.refusal(certain_only=True)) is not None:
                    raise refused  # retrying cannot help, so do not wait out the timeout
                if self.transport.nobody_listens(time.monotonic() - started):
                    raise self._no_server(refused=True)
        finally:
            self.transport.give_up(asked)  # the other askings: a late answer to one is dropped

    def _no_server(self, *, refused: bool) -> NoServerError:
        """The error for a handshake nobody answered (``refused``: as nothing listens)."""
        return NoServerError(self.address, port_out=self.port_out, timeout_ms=self.timeout, refused=refused)

    def ask_config(self, model: str | None) -> dict[str, Any]:
        """The config of ``model`` (``None``: the server's default), asked for afresh and kept."""
        self._configs[model] = self.call(CONFIG, "CONFIG", model_field(model))
        return self._configs[model]

    def config_of(self, model: str | None) -> dict[str, Any]:
        """The config of ``model`` (``None``: the server's default) as last told: asked for the
        first time a request goes to it, then kept."""
        if model in self._configs:
            return self._configs[model]
        return self.ask_config(model)

    def check_server(self) -> None:
        """Raise :class:`ProtocolVersionError` if the server speaks another protocol; warn
        (on behalf of whoever made the client) if it runs another version of bertserve."""
        check_server(self.config, self.address, stacklevel=4)  # past BertClient.__init__: its caller

    # -- requests ----------------------------------------------------------------------

    def request(
        self, command: bytes, deadline: float, texts: Sequence[Any] = (), header: dict[str, Any] | None = None
    ) -> int:
        """Send one request; its id."""
        request_id = self.transport.new_id()
        frames = encode_request(
            self.transport.identity, command, request_id, {"client_version": __version__, **(header or {})}, texts
        )
        check_size(frames, self.config)
        if not self.transport.send(request_id, frames, deadline):
            raise self.timeout_error(f"request {request_id} (the send queue stayed full)")
        return request_id

    def send_encode(self, texts: Sequence[Any], deadline: float, options: EncodeOptions, *, fetchable: bool) -> int:
        """Send an ENCODE request whose answer someone will collect; its id. Its header carries
        ``options`` and the time left until ``deadline``, after which the server drops it."""
        header = options.header((deadline - time.monotonic()) * 1000)
        request_id = self.request(ENCODE, deadline, texts, header)
        self.transport.expect(request_id, Pending(options.show_tokens, fetchable))
        return request_id

    def call(self, command: bytes, what: str, header: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a command (``what`` names it in a timeout) and wait for its answer."""
        deadline = self.deadline()
        request_id = self.request(command, deadline, header=header)
        reply = self.transport.await_any({request_id}, deadline)
        if reply is None:
            self.give_up({request_id})
            raise self.timeout_error(f"{what} (request {request_id})")
        return answer(reply)

    def collect(
        self, wanted: Collection[int], deadline: float, what: str, output_fmt: Literal["ndarray", "list"]
    ) -> EncodeResult:
        """The answer to the first of the ENCODE requests ``wanted`` to be answered, in
        ``output_fmt``. If none is answered by ``deadline`` they are all given up, and the
        timeout names them as ``what``."""
        reply = self.transport.await_any(wanted, deadline)
        if reply is None:
            self.give_up(wanted)
            raise self.timeout_error(what)
        return encode_result(reply, self.transport.take(reply.request_id).show_tokens, output_fmt)

    def fetchable(self) -> set[int]:
        """The ``blocking=False`` requests whose answers :meth:`collect` has not yet given."""
        return {request_id for request_id, pending in self.transport.pending.items() if pending.fetchable}

    def give_up(self, request_ids: Iterable[int]) -> None:
        """Drop the replies to ``request_ids`` if they come."""
        self.transport.give_up(request_ids)

    def timeout_error(self, what: str) -> BertClientError:
        """The error for a wait that ran out: a failed handshake if there was one, since
        then the server never saw us, else a timeout."""
        refused = self.transport.refusal()
        if refused is not None:
            return refused
        return ServerTimeoutError(
            f"no answer from the bertserve server at {self.address} (replies on port {self.port_out}) "
            f"to {what} within {self.timeout:g} ms",
            address=self.address,
            timeout_ms=self.timeout,
        )

    def close(self) -> None:
        """Forget every request and close the sockets."""
        self.transport.close()

    def destroy(self) -> None:
        """Close the sockets of a connection that never came up."""
        self.transport.destroy()


# -- shared with the asyncio client ---------------------------------------------------------


def check_server(config: dict[str, Any], address: str, *, stacklevel: int, advice: Advice = PYTHON) -> None:
    """Raise :class:`ProtocolVersionError` if the server of ``config`` speaks another protocol;
    warn (``stacklevel`` up, in the words of ``advice``) if it runs another version of bertserve."""
    protocol = config.get("protocol")
    if protocol is not None and protocol != PROTOCOL_VERSION:
        raise ProtocolVersionError(
            f"the server at {address} speaks protocol {protocol!r}, this client "
            f"{PROTOCOL_VERSION}: install the bertserve version the server runs "
            f"({config.get('server_version', 'unknown')})"
        )
    server_version = config.get("server_version")
    if server_version != __version__:
        silence = f"; {advice.silence_version} to silence this" if advice.silence_version else ""
        warnings.warn(
            f"the server at {address} runs bertserve {server_version or '(unknown version)'}, "
            f"this client {__version__}{silence}",
            stacklevel=stacklevel,
        )


def length_warning(config: dict[str, Any], texts: list[Any], is_tokenized: bool, advice: Advice = PYTHON) -> str | None:
    """What to warn of, in the words of ``advice``, if one of ``texts`` has more words than
    the ``max_seq_len`` of the server of ``config``."""
    limit = config.get("max_seq_len")
    if isinstance(limit, bool) or not isinstance(limit, int):
        return None
    for i, item in enumerate(texts):
        if (words := len(item) if is_tokenized else len(item.split())) > limit:
            silence = f", or {advice.silence_length} to silence this" if advice.silence_length else ""
            return (
                f"{advice.name(i)} has {words} words, more than the server's max_seq_len={limit} tokens: "
                f"it and any other long {advice.input} will be truncated; {advice.chunk} to encode it in "
                f"windows{',' if silence else ' or'} start the server with a larger {advice.max_seq_len}{silence}"
            )
    return None


def check_size(frames: list[bytes], config: dict[str, Any]) -> None:
    """Raise ``ValueError`` if the request ``frames`` are larger than the server of ``config``
    takes: its socket would drop them unread, and the client would only see a timeout."""
    limit = config.get("max_message_bytes")
    if isinstance(limit, int) and not isinstance(limit, bool) and len(frames[-1]) > limit:
        raise ValueError(
            f"the request is {len(frames[-1])} bytes as JSON; the server takes at most {limit} bytes per "
            "message (max_message_bytes): send fewer or shorter texts per request"
        )
