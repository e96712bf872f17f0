"""What every gRPC call passes before its method runs, and what it is told when it fails
(:class:`Guard`): the API key in its ``authorization: Bearer`` metadata; a place among the calls
the process holds, and among its principal's; its deadline, carried to the head as the request's;
a span, the child of the ``traceparent`` in its metadata; its metrics; and its failure as a gRPC
status whose message names the field at fault (:mod:`.status`).

A principal is an API key's name, or without keys the peer's address, as over HTTP
(:mod:`..http.principals`); the server's per-client bounds and turns apply to each.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
from pydantic import ValidationError

from .. import metrics, tracing
from ..config.grpc import Grpc
from ..http.disconnects import Call
from ..http.principals import Principals
from ..http.schemas import HTTPError, bounded
from .status import CallError, status_of

MODEL_KEY = "bertserve-model"
"""The metadata key naming the served model a call is for (else the default model of its task)."""
_BEARER = "bearer "
_MAX_KEY_CHARS = 1024


class Guard:
    """The gRPC process's calls: who makes each, how many are open, and how each one ends."""

    def __init__(self, principals: Principals, options: Grpc) -> None:
        self.principals = principals
        self.options = options
        self._open: Counter[str] = Counter()
        self._total = 0

    @contextlib.asynccontextmanager
    async def call(self, context: grpc.aio.ServicerContext, method: str) -> AsyncIterator[Call]:
        """One call of ``method`` (``tei.v1.Embed/Embed``) while it runs, as the API sees it;
        an error raised in it ends the call with its status."""
        started = time.monotonic()
        code = grpc.StatusCode.OK
        metadata = _metadata(context.invocation_metadata() or ())
        span = _span(method, metadata, context.peer())
        owner: str | None = None
        try:
            with _current(span):
                try:
                    owner = self._admit(metadata, context.peer())
                    yield _call(context, owner)
                except HTTPError as exc:
                    code = status_of(exc)
                    message = exc.message
                except CallError as exc:
                    code, message = exc.code, str(exc)
                except ValidationError as exc:
                    code, message = grpc.StatusCode.INVALID_ARGUMENT, _invalid(exc)
                except asyncio.CancelledError:
                    code = grpc.StatusCode.CANCELLED
                    raise
                if code is not grpc.StatusCode.OK:
                    await context.abort(code, message)
        finally:
            if owner is not None:
                self._leave(owner)
            seconds = time.monotonic() - started
            metrics.GRPC_CALLS.labels(method, code.name).inc()
            metrics.GRPC_SECONDS.labels(method).observe(seconds)
            tracing.end(
                span,
                error=None if code in _CALLERS_FAULT or code is grpc.StatusCode.OK else code.name,
                attributes={"rpc.grpc.status_code": code.value[0]},
            )

    def model(self, context: grpc.aio.ServicerContext) -> str | None:
        """The model the call's ``bertserve-model`` metadata names (None: the default of its task)."""
        return _metadata(context.invocation_metadata() or ()).get(MODEL_KEY)

    def _admit(self, metadata: dict[str, str], peer: str) -> str:
        """The call's principal, as :class:`Call` owners are written, once it has a place."""
        owner = self._principal(metadata, peer)
        options = self.options
        if self._total >= options.max_grpc_calls:
            raise CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the server holds {self._total} gRPC calls, its most (--max-grpc-calls): try again later",
            )
        if self._open[owner] >= options.max_grpc_calls_per_principal:
            raise CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this caller holds {self._open[owner]} gRPC calls, its most (--max-grpc-calls-per-principal): "
                "end some before opening more",
            )
        self._open[owner] += 1
        self._total += 1
        metrics.GRPC_OPEN_CALLS.inc()
        return owner

    def _leave(self, owner: str) -> None:
        self._open[owner] -= 1
        if not self._open[owner]:
            del self._open[owner]
        self._total -= 1
        metrics.GRPC_OPEN_CALLS.dec()

    def _principal(self, metadata: dict[str, str], peer: str) -> str:
        """``key:NAME`` for a call with a valid key, ``address:HOST`` where none is needed;
        UNAUTHENTICATED for a missing or wrong key where one is."""
        if not self.principals.required:
            return "address:" + _host(peer)
        given = metadata.get("authorization")
        if given is None:
            raise CallError(
                grpc.StatusCode.UNAUTHENTICATED, "an API key is needed: send the metadata authorization: Bearer KEY"
            )
        if not given[: len(_BEARER)].lower() == _BEARER or len(given) > _MAX_KEY_CHARS:
            raise CallError(grpc.StatusCode.UNAUTHENTICATED, "the authorization metadata must be Bearer KEY")
        name = self.principals.authenticate(given[len(_BEARER) :].strip().encode())
        if name is None:
            raise CallError(grpc.StatusCode.UNAUTHENTICATED, "the API key is not valid")
        return "key:" + name


_CALLERS_FAULT = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def _call(context: grpc.aio.ServicerContext, owner: str) -> Call:
    """The call as the API sees it: its owner, the wait for its end, and its deadline."""
    ended = asyncio.Event()
    context.add_done_callback(lambda _: ended.set())
    remaining = context.time_remaining()
    deadline = time.monotonic() + remaining if remaining is not None else None
    return Call(owner, ended.wait, deadline)


def _metadata(pairs: Iterable[Any]) -> dict[str, str]:
    """A call's text metadata by key (binary ``-bin`` values left out), the first of each key."""
    found: dict[str, str] = {}
    for key, value in pairs:
        if isinstance(value, str) and key not in found:
            found[key] = value
    return found


def _host(peer: str) -> str:
    """The address of a peer as gRPC writes it (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``)."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host = rest.rpartition(":")[0] or rest
        return host.replace("%5B", "[").replace("%5D", "]").strip("[]")
    return bounded(peer, 100)


def _invalid(exc: ValidationError) -> str:
    """The first problem pydantic found, by where it is (never the value it quotes)."""
    errors = exc.errors()
    if not errors:
        return "the request is not valid"
    where = ".".join(str(part) for part in errors[0]["loc"]) or "request"
    return f"{where}: {errors[0]['msg']}"


def _span(method: str, metadata: dict[str, str], peer: str) -> Any:
    if not tracing.enabled():
        return None
    service, _, name = method.partition("/")
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name, "client.address": _host(peer)}
    return tracing.server_span(method, metadata.get("traceparent"), metadata.get("tracestate"), attributes)


@contextlib.contextmanager
def _current(span: Any) -> Any:
    """``span`` current while the call runs, so the head's span of its request is its child."""
    if span is None:
        yield
        return
    from opentelemetry import trace

    with trace.use_span(span, end_on_exit=False):
        yield
