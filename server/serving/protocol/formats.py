"""Reply formats: how a request's answers are laid out for the client that sent it.

A format is chosen once, when the ventilator reads a request (ours, or bert-as-service 1.x's
client, :mod:`.legacy`), and travels with it: in the REGISTER the sink gets, and in each
PUBLISH and STATUS for it. The ventilator and the sink call the format they were given
rather than asking which client it was.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from bertserve.client import protocol as p

from . import legacy


class ReplyFormat:
    """Our own layout (:mod:`bertserve.client.protocol`)."""

    name = b"native"
    held = False  # replies wait for the client's subscription (bert-as-service's client subscribes late)
    status_with_config = False  # a STATUS answer holds the server's config too

    def vectors(self, client: bytes, request_id: int, array: np.ndarray, header: dict[str, Any]) -> list[Any]:
        """The reply with a request's vectors; ``header`` is the array's with what goes with it."""
        return p.encode_reply(client, request_id, True, header, array.data)

    def error(self, client: bytes, request_id: int, message: str, kind: str) -> list[Any]:
        return p.error_reply(client, request_id, message, kind)

    def answer(self, request: p.Request, answer: dict[str, Any], buffer: Any = None) -> list[Any]:
        """The reply to ``request`` (a command, or an ENCODE answered at once) carrying ``answer``."""
        return p.encode_reply(request.client_id, request.request_id, True, answer, buffer)

    def refusal(self, request: p.Request, message: str, kind: str) -> list[Any]:
        return self.error(request.client_id, request.request_id, message, kind)

    def status(self, client: bytes, request_id: int, status: dict[str, Any]) -> list[Any]:
        return p.encode_reply(client, request_id, True, status)

    def request_id_of(self, frames: list[Any]) -> int | None:
        """The request id of a reply laid out this way; ``None`` if it has none."""
        return _int(frames[1]) if len(frames) > 1 else None


class LegacyFormat(ReplyFormat):
    """bert-as-service 1.x's layout, for its own client (:mod:`.legacy`)."""

    name = b"legacy"
    held = True
    status_with_config = True

    def vectors(self, client: bytes, request_id: int, array: np.ndarray, header: dict[str, Any]) -> list[Any]:
        return legacy.vectors_reply(client, request_id, array, header.get("tokens"))

    def error(self, client: bytes, request_id: int, message: str, kind: str) -> list[Any]:
        return legacy.error_reply(client, request_id, message, kind)

    def answer(self, request: p.Request, answer: dict[str, Any], buffer: Any = None) -> list[Any]:
        return legacy.translate(request, super().answer(request, answer, buffer))

    def status(self, client: bytes, request_id: int, status: dict[str, Any]) -> list[Any]:
        return legacy.status_reply(client, request_id, status)

    def request_id_of(self, frames: list[Any]) -> int | None:
        return _int(frames[-1]) if len(frames) > 1 else None


NATIVE = ReplyFormat()
LEGACY = LegacyFormat()
_BY_NAME = {NATIVE.name: NATIVE, LEGACY.name: LEGACY}


def named(name: bytes | str) -> ReplyFormat:
    """The format called ``name`` (from an internal frame); our own for a name not known."""
    return _BY_NAME.get(name.encode() if isinstance(name, str) else bytes(name), NATIVE)


def _int(frame: Any) -> int | None:
    try:
        return int(bytes(frame))
    except ValueError:
        return None
