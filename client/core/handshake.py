"""The handshake, sans-IO: what a connecting client sends, when it asks again, when it gives
up and with which error, and what the answer means.

A client asks for the configuration of its model (CONFIG), again every :data:`RESEND_S` until
an answer comes through: until the server's ``PUB`` has seen the client's subscription
(ZeroMQ's slow joiner), a reply published to it is silently lost. Unanswered at first, it looks
whether anything listens at all (:class:`~bertserve.client.probe.ServerProbe`): a server on
this machine that is not running raises :class:`NoServerError` within a second, as does any
server that does not answer the handshake within the timeout. A handshake that CURVE refused
raises :class:`AuthenticationError`, at once if retrying cannot mend it; one that failed because
something other than a bertserve server answers (its HTTP port, say) raises
:class:`WrongPortError` within a second or two. A server that answers at the request port
while nothing, or something else, answers at ``port_out``
(:class:`~bertserve.client.reply_port.ReplyPortCheck`) raises :class:`WrongReplyPortError`:
within a second or two if something else answers there, two or three if nothing does, and
at the latest at the timeout.

:class:`Handshake` decides; the drivers (``sync/connection.py``, ``aio/client.py``) send, wait
and tell it what they saw.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from .._version import __version__
from ..advice import PYTHON, Advice
from ..errors import BertClientError, NoServerError, ProtocolVersionError, WrongPortError, WrongReplyPortError
from ..protocol import CONFIG, PROTOCOL_VERSION, Reply
from ..reply_port import ReplyPortCheck
from .options import model_field
from .results import answer

RESEND_S = 0.2
"""How often an unanswered handshake asks again."""


class Handshake:
    """The handshake of a client of the server at ``address`` (replies on ``port_out``) that
    asks for the configuration of ``model`` (``None``: the server's default), started at
    ``now`` and given ``timeout_ms``."""

    command = CONFIG

    def __init__(self, model: str | None, *, address: str, port_out: int, timeout_ms: float, now: float) -> None:
        self.header = model_field(model)  # what each asking carries beside the command
        self.address = address
        self.port_out = port_out
        self.timeout_ms = timeout_ms
        self.started = now
        self.deadline = now + timeout_ms / 1000

    def wait_until(
        self, now: float, refusal: Callable[[], BertClientError | None], reply_port: ReplyPortCheck | None = None
    ) -> float:
        """Until when to wait for an answer to the asking sent ``now``; at the deadline, raise
        the failed handshake ``refusal()`` tells of, or what ``reply_port`` found at the client's
        reply port, or else :class:`NoServerError`."""
        if now >= self.deadline:
            found = reply_port.final() if reply_port is not None else None
            failed = refusal()
            if found is not None and (failed is None or self._at_reply_port(failed)):
                raise self.wrong_reply_port(found)
            raise failed or self.no_server(refused=False)
        return min(self.deadline, now + RESEND_S)

    def unanswered(
        self,
        now: float,
        refusal: BertClientError | None,
        nobody_listens: Callable[[float], bool],
        reply_port: ReplyPortCheck | None = None,
    ) -> None:
        """A wait ended ``now`` with no answer: raise if waiting on cannot help, that is if the
        handshake was ``refusal`` for good, or ``nobody_listens`` after the time waited, or a
        server answers while ``reply_port`` found something else at the client's reply port."""
        if reply_port is not None and (found := reply_port.look(now - self.started)) is not None:
            raise self.wrong_reply_port(found)
        if refusal is not None and not (self._at_reply_port(refusal) and reply_port and reply_port.deciding):
            raise refusal  # (what answers at the reply port is said once it is known whether a server runs)
        if nobody_listens(now - self.started):  # on this machine, said within a second
            raise self.no_server(refused=True)

    def config(self, reply: Reply) -> dict[str, Any]:
        """The configuration the answer ``reply`` gives; :class:`ProtocolVersionError` if the
        server does not speak this client's protocol, the server's error if it refused."""
        if not reply.ok and reply.header.get("kind") == "protocol":
            raise ProtocolVersionError(
                f"the server at {self.address} does not speak protocol {PROTOCOL_VERSION} "
                f"(bertserve client {__version__}): {reply.header.get('error')}"
            )
        return answer(reply)

    def no_server(self, *, refused: bool) -> NoServerError:
        """The error for a handshake nobody answered (``refused``: as nothing listens)."""
        return NoServerError(self.address, port_out=self.port_out, timeout_ms=self.timeout_ms, refused=refused)

    def wrong_reply_port(self, found: str) -> WrongReplyPortError:
        """The error for a server that runs while ``found`` answers at the client's reply port."""
        port = int(self.address.rsplit(":", 1)[1])
        return WrongReplyPortError(
            self.address, port=port, port_out=self.port_out, timeout_ms=self.timeout_ms, found=found
        )

    def _at_reply_port(self, failed: BertClientError) -> bool:
        """Whether ``failed`` names what answers at the client's reply port, not at the server's address."""
        return isinstance(failed, WrongPortError) and failed.address != self.address


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
