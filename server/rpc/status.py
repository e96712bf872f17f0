"""What a failed call is told: the HTTP API's errors (:class:`~..http.schemas.HTTPError`, raised
by the checks both front ends share) as gRPC status codes, each with the message that names the
field at fault."""

from __future__ import annotations

import grpc

from ..http.schemas import CLIENT_CLOSED, HTTPError

_BY_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ALREADY_EXISTS,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    CLIENT_CLOSED: grpc.StatusCode.CANCELLED,
    502: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
_BY_CODE = {
    "task": grpc.StatusCode.FAILED_PRECONDITION,  # the model named serves another task
    "context_length_exceeded": grpc.StatusCode.INVALID_ARGUMENT,  # an input longer than the model takes
    "too_long": grpc.StatusCode.INVALID_ARGUMENT,
    "shutdown": grpc.StatusCode.UNAVAILABLE,
}


class CallError(Exception):
    """A call refused by the gRPC front end itself, with the status it is answered with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def status_of(error: HTTPError) -> grpc.StatusCode:
    """The status code of one of the HTTP API's errors. A 413 is "too large" (RESOURCE_EXHAUSTED)
    unless it is an input longer than the model takes, which is that input's fault (INVALID_ARGUMENT)."""
    by_code = _BY_CODE.get(error.code or "")
    if by_code is not None:
        return by_code
    if error.status == 413 and error.code != "limit":
        return grpc.StatusCode.INVALID_ARGUMENT
    return _BY_STATUS.get(error.status, grpc.StatusCode.INTERNAL)
