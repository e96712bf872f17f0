"""The sync driver of the client core: a client's connection to one server, each wait
bounded by the timeout.

:meth:`Connection.handshake` runs the :class:`~bertserve.client.core.handshake.Handshake`
(what to ask, when to ask again, which error ends it) over a
:class:`~bertserve.client.sync.transport.Transport`; requests are framed by the
:class:`~bertserve.client.core.base.ClientCore` and their replies matched by the transport's
:class:`~bertserve.client.core.replies.ReplyBook`. A wait that runs out raises the error the
core names: :class:`AuthenticationError` if a handshake was refused, since then the server
never saw the client, and :class:`ServerTimeoutError` otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..core.base import ClientCore
from ..core.handshake import Handshake
from ..core.options import EncodeOptions, model_field, tcp_address
from ..core.results import EncodeResult, answer, encode_result
from ..errors import BertClientError
from ..protocol import CONFIG, ENCODE, Reply
from ..reply_port import ReplyPortCheck
from .transport import Transport


@dataclass
class Pending:
    """What becomes of the reply to a request someone will collect."""

    show_tokens: bool
    fetchable: bool  # sent with blocking=False, so fetch() hands it out


class Connection:
    """The sockets to the server ``core`` names (see :class:`Transport`), waiting at most the
    core's timeout for anything."""

    def __init__(self, core: ClientCore) -> None:
        self.core = core
        options = core.options
        self.transport: Transport[Pending] = Transport(
            options.host, options.port, options.port_out, options.identity, options.curve
        )

    def deadline(self) -> float:
        """When a wait that starts now gives up."""
        return time.monotonic() + self.core.timeout / 1000

    # -- connecting --------------------------------------------------------------------

    def handshake(self) -> dict[str, Any]:
        """Ask for the config of the client's model, re-asking until the subscription has
        reached the server's PUB socket and an answer comes through."""
        handshake = self.core.handshake(time.monotonic())
        options = self.core.options
        reply_port = ReplyPortCheck(options.host, self.transport.address, tcp_address(options.host, options.port_out))
        try:
            reply = self._first_answer(handshake, reply_port)
        finally:
            reply_port.close()
            self.transport.stop_probing()
        config = self.core.connected(handshake, reply)
        self.transport.window.fit(config)  # as many requests in flight as the server queues replies
        return config

    def _first_answer(self, handshake: Handshake, reply_port: ReplyPortCheck) -> Reply:
        asked: set[int] = set()
        try:
            while True:
                until = handshake.wait_until(time.monotonic(), self.transport.refusal, reply_port)
                asked.add(self.request(handshake.command, handshake.deadline, header=handshake.header))
                reply = self.transport.await_any(asked, until)
                if reply is not None:
                    asked.discard(reply.request_id)
                    return reply
                refusal = self.transport.refusal(certain_only=True)
                handshake.unanswered(time.monotonic(), refusal, self.transport.nobody_listens, reply_port)
        finally:
            self.transport.give_up(asked)  # the other askings: a late answer to one is dropped

    def ask_config(self, model: str | None) -> dict[str, Any]:
        """The config of ``model`` (``None``: the server's default), asked for afresh and kept."""
        return self.core.learn(model, self.call(CONFIG, "CONFIG", model_field(model)))

    def config_of(self, model: str | None) -> dict[str, Any]:
        """The config of ``model`` (``None``: the server's default) as last told: asked for the
        first time a request goes to it, then kept."""
        known = self.core.known_config(model)
        return known if known is not None else self.ask_config(model)

    # -- requests ----------------------------------------------------------------------

    def request(
        self, command: bytes, deadline: float, texts: Sequence[Any] = (), header: dict[str, Any] | None = None
    ) -> int:
        """Send one request; its id."""
        request_id = self.transport.book.new_id()
        frames = self.core.frames(command, request_id, header, texts)
        if not self.transport.send(request_id, frames, deadline):
            raise self.timeout_error(f"request {request_id} (the send queue stayed full)")
        return request_id

    def send_encode(self, texts: Sequence[Any], deadline: float, options: EncodeOptions, *, fetchable: bool) -> int:
        """Send an ENCODE request whose answer someone will collect; its id. Its header carries
        ``options`` and the time left until ``deadline``, after which the server drops it."""
        header = options.header((deadline - time.monotonic()) * 1000)
        request_id = self.request(ENCODE, deadline, texts, header)
        self.transport.book.expect(request_id, Pending(options.show_tokens, fetchable))
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
        if reply is None:  # past their deadline: the server drops them itself, no CANCEL needed
            self.transport.give_up(wanted)
            raise self.timeout_error(what)
        return encode_result(reply, self.transport.book.take(reply.request_id).show_tokens, output_fmt)

    def fetchable(self) -> set[int]:
        """The ``blocking=False`` requests whose answers :meth:`collect` has not yet given."""
        return {request_id for request_id, pending in self.transport.pending.items() if pending.fetchable}

    def give_up(self, request_ids: Iterable[int]) -> None:
        """Drop the replies to ``request_ids`` if they come, withdrawing the ENCODE requests
        among them from the server (Ctrl-C, a chunked input given up before its end)."""
        self.transport.withdraw(request_ids, self.core.cancel_frames)

    def timeout_error(self, what: str) -> BertClientError:
        """The error for a wait for ``what`` that ran out (see :meth:`ClientCore.timeout_error`)."""
        return self.core.timeout_error(what, self.transport.refusal())

    def close(self) -> None:
        """Forget every request and close the sockets."""
        self.transport.close()

    def destroy(self) -> None:
        """Close the sockets of a connection that never came up."""
        self.transport.destroy()
