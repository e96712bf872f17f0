"""The requests the ventilator has admitted and not yet seen through: each one's client,
deadline, rows left to compute, reply format and the memory its texts hold. The one owner
of that state; the sink keeps its own, of the rows it has assembled."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..protocol.formats import ReplyFormat


@dataclass
class Admitted:
    client: bytes
    request_id: int
    wire_key: str  # the client id and request id, as the client sees the request
    rows: int  # rows not yet computed
    deadline: float
    format: ReplyFormat
    nbytes: int = 0  # what its texts hold in memory, counted against max_queued_bytes
    model: str = ""  # the served model it runs on


class AdmittedRequests:
    def __init__(self) -> None:
        self.requests: dict[str, Admitted] = {}
        self.queued_bytes = 0  # what the texts of the requests hold, at most max_queued_bytes
        self._live: dict[str, str] = {}  # the wire key -> the internal key
        self._serials = itertools.count()

    def __len__(self) -> int:
        return len(self.requests)

    def __contains__(self, key: object) -> bool:
        return key in self.requests

    def get(self, key: str) -> Admitted | None:
        return self.requests.get(key)

    def pending(self, wire_key: str) -> bool:
        """Whether the client's request of this id is admitted and not yet answered."""
        return wire_key in self._live

    def key_of(self, wire_key: str) -> str | None:
        """The internal key of the client's pending request of this id."""
        return self._live.get(wire_key)

    def new_key(self, wire_key: str) -> str:
        """The internal key of a request about to be admitted: unique per admission, so nothing
        of an earlier request under the same client and request id (a late result, say) can
        land in this one."""
        return f"{wire_key}@{next(self._serials)}"

    def add(self, key: str, request: Admitted) -> None:
        self.requests[key] = request
        self._live[request.wire_key] = key
        self.queued_bytes += request.nbytes

    def rows_done(self, key: str, rows: int) -> None:
        """``rows`` of request ``key`` were computed; once all are, it is no longer held."""
        request = self.requests.get(key)
        if request is not None:
            request.rows -= rows
            if request.rows <= 0:
                self.finish(key)

    def finish(self, key: str) -> Admitted | None:
        request = self.requests.pop(key, None)
        if request is not None:
            self._live.pop(request.wire_key, None)
            self.queued_bytes -= request.nbytes
        return request

    def expired(self, now: float) -> set[str]:
        return {key for key, request in self.requests.items() if request.deadline <= now}

    def clear(self) -> set[str]:
        """Forget every request (shutdown); returns their keys."""
        keys = set(self.requests)
        self.requests.clear()
        self._live.clear()
        self.queued_bytes = 0
        return keys
