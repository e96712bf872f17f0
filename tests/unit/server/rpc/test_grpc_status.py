"""The HTTP API's errors as gRPC status codes (server/rpc/status.py): busy and too large are
RESOURCE_EXHAUSTED, an input too long for the model is the caller's INVALID_ARGUMENT, a model of
another task FAILED_PRECONDITION, an unknown one NOT_FOUND."""

from __future__ import annotations

import grpc
import pytest
from bertserve.server.http.schemas import STATUS_OF_KIND, HTTPError
from bertserve.server.rpc.status import status_of

S = grpc.StatusCode


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (422, None, S.INVALID_ARGUMENT),
        (400, "task", S.FAILED_PRECONDITION),
        (404, "model_not_found", S.NOT_FOUND),
        (413, "limit", S.RESOURCE_EXHAUSTED),
        (413, None, S.INVALID_ARGUMENT),
        (413, "context_length_exceeded", S.INVALID_ARGUMENT),
        (429, "busy", S.RESOURCE_EXHAUSTED),
        (503, "shutdown", S.UNAVAILABLE),
        (503, None, S.UNAVAILABLE),
        (504, "timeout", S.DEADLINE_EXCEEDED),
        (499, "cancelled", S.CANCELLED),
        (401, None, S.UNAUTHENTICATED),
        (500, "worker", S.INTERNAL),
        (418, None, S.INTERNAL),
    ],
)
def test_each_error_has_its_status(status: int, code: str | None, expected: grpc.StatusCode) -> None:
    assert status_of(HTTPError(status, "a message", code=code)) is expected


def test_every_kind_the_head_answers_has_a_status_that_is_not_unknown() -> None:
    for kind, status in STATUS_OF_KIND.items():
        assert status_of(HTTPError(status, "m", code=kind)) is not S.UNKNOWN, kind
