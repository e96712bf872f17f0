"""Traces: each process's spans, sent to an OpenTelemetry collector (OTLP over HTTP), and the
W3C ``traceparent`` that carries a request's trace from one process to the next.

A request's trace crosses the server's processes in its frames, never through a shared
object: the HTTP process starts it (or continues the caller's ``traceparent``) and sends its
context in the ENCODE header; the head's span of the request is the parent of what the
worker and the sink do for it, and its context rides in the job's parts and in the sink's
REGISTER (each a ``traceparent`` of 55 characters, checked against :data:`TRACEPARENT`).

Which requests are traced is the server's to decide, not a caller's: the sampler is the
SDK's (``OTEL_TRACES_SAMPLER``, by default ``parentbased_always_on``), but under a parent-based
one, the default included, an HTTP request's span is decided by its root sampler as for a
trace that begins here, on a trace id the server draws for the purpose (:func:`_decided_here`).
Neither the sampled flag of the caller's ``traceparent`` nor the trace id it names (which a
ratio sampler would read) decides: with ``parentbased_traceidratio`` a caller's requests are
traced at the ratio as any others are, and with ``parentbased_always_on`` all are, those whose
caller did not sample its own trace too. A span that is kept still continues the caller's
trace (its trace id, its span as parent, its ``tracestate``). The head, worker and sink follow
the HTTP span's decision (their parent-based sampler reads the flag of the context the HTTP
process sent on); a ZeroMQ client's ``traceparent`` is a caller's, decided by the head as the
HTTP process decides an HTTP caller's. A sampler that is not parent-based reads no caller's flag: ``traceidratio``
decides by the trace id in each process alike, a caller's too, so it is
``parentbased_traceidratio`` that samples callers at the ratio.

Off unless :func:`setup` ran (``--otlp-endpoint``, or the ``OTEL_EXPORTER_OTLP_*``
variables): then every function here returns at once without importing OpenTelemetry, and
no frame carries a trace. A worker runs one job for the pieces of several requests at once:
it times its steps once, and :func:`record` gives each traced request its own spans of them.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TRACEPARENT_PATTERN = r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
"""A W3C ``traceparent`` of version 00, the only form a frame may carry."""
TRACEPARENT = re.compile(TRACEPARENT_PATTERN)
_INVALID_IDS = ("0" * 32, "0" * 16)  # W3C: a trace or parent id of zeros is invalid
_MEMBER = (
    r"(?:[a-z][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
_TRACESTATE = re.compile(rf"[ \t]*{_MEMBER}[ \t]*(?:,[ \t]*{_MEMBER}[ \t]*){{0,31}}")
"""A W3C ``tracestate`` the SDK reads without complaint: another is dropped here, unlogged,
since a caller could otherwise make the SDK log a warning for every request."""

SHUTDOWN_MS = 2000
"""How long the spans still batched get to leave as a process stops: a collector that is down
or slow costs a stop no more than this."""

_tracer: Any = None  # opentelemetry's Tracer, once setup() ran
_provider: Any = None


@dataclass(frozen=True)
class Step:
    """A step timed after the fact (``time.time_ns()`` instants), recorded as a child span."""

    name: str
    start_ns: int
    end_ns: int


def setup(endpoint: str, role: str, model: str | None = None) -> None:
    """Send this process's spans to ``endpoint`` (an OTLP/HTTP collector's ``.../v1/traces``),
    batched (``OTEL_BSP_*``), its resource naming the service (``OTEL_SERVICE_NAME``, else
    ``bertserve``), this process's ``role`` and the ``model`` it serves. The sampler is the
    SDK's (``OTEL_TRACES_SAMPLER``; by default every trace), a caller's request decided here
    (see the module)."""
    install(_batched(endpoint), role, model)


def check(endpoint: str) -> None:
    """Make what :func:`setup` makes, and drop it: a setting of OpenTelemetry's variables that
    the SDK refuses (``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` over ``OTEL_BSP_MAX_QUEUE_SIZE``, say)
    is refused at start, by the command, not by each process as it starts."""
    from .errors import ConfigError

    try:
        processor = _batched(endpoint)
    except ValueError as exc:
        raise ConfigError(f"OpenTelemetry's settings (OTEL_BSP_*, OTEL_EXPORTER_OTLP_*) do not hold: {exc}") from None
    processor.shutdown()


def _batched(endpoint: str) -> Any:
    """The SDK's batching span processor over its OTLP/HTTP exporter to ``endpoint``."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))


def install(processor: Any, role: str, model: str | None = None) -> None:
    """Trace through ``processor`` (an OpenTelemetry ``SpanProcessor``: the exporter's, or a
    test's in-memory one)."""
    global _tracer, _provider
    from bertserve.client import __version__
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    attributes = {
        "service.name": os.environ.get("OTEL_SERVICE_NAME") or "bertserve",
        "service.version": __version__,
        "bertserve.role": role,
        "process.pid": os.getpid(),
    }
    if model:
        attributes["bertserve.model"] = model
    _provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    _provider.sampler = _decided_here(_provider.sampler)  # before get_tracer: its tracer takes it
    _provider.add_span_processor(processor)
    _tracer = _provider.get_tracer("bertserve")
    # The SDK's own warnings (a collector that does not answer) go where this process logs, in its form.
    sdk_logger = logging.getLogger("opentelemetry")
    sdk_logger.handlers[:] = logging.getLogger("bertserve").handlers
    sdk_logger.setLevel(logging.WARNING)
    sdk_logger.propagate = False


def shutdown() -> None:
    """Send the spans still batched, and stop: a process calls it as it exits (a spawned
    child ends with ``os._exit``, which runs no exit handler)."""
    global _tracer, _provider
    if _provider is not None:
        # In a thread of its own, waited for SHUTDOWN_MS at most: the SDK's shutdown waits for an
        # export under way, whose retries last up to its timeout (OTEL_EXPORTER_OTLP_TIMEOUT, 10 s).
        stopping = threading.Thread(target=_provider.shutdown, name="bertserve-traces-shutdown", daemon=True)
        stopping.start()
        stopping.join(SHUTDOWN_MS / 1000)
    _tracer = _provider = None


def enabled() -> bool:
    return _tracer is not None


def checked_traceparent(value: Any) -> str | None:
    """``value`` if it is a W3C traceparent (version 00) whose ids are not zeros; None otherwise."""
    if not isinstance(value, str) or not TRACEPARENT.fullmatch(value):  # not match: "$" takes a last "\n"
        return None
    _, trace_id, parent_id, _ = value.split("-")
    return None if trace_id == _INVALID_IDS[0] or parent_id == _INVALID_IDS[1] else value


def start(
    name: str, *, parent: str | None = None, attributes: Mapping[str, Any] | None = None, caller: bool = False
) -> Any:
    """A span begun now, the child of ``parent`` (a traceparent) or the root of a new trace;
    None while tracing is off. With ``caller``, ``parent`` is a caller's, not one of this
    server's processes': the span is of kind SERVER, sampled as this server decides (see the
    module)."""
    if _tracer is None:
        return None
    if not caller:
        return _tracer.start_span(name, context=_context(parent), attributes=attributes)
    from opentelemetry.trace import SpanKind

    return _tracer.start_span(name, context=_context(parent), kind=SpanKind.SERVER, attributes=attributes)


def server_span(name: str, traceparent: Any, tracestate: Any, attributes: Mapping[str, Any]) -> Any:
    """A span of kind SERVER begun now: the child of a caller's ``traceparent`` header (with
    its ``tracestate``), or, for a missing or malformed one, the root of a new trace, as W3C
    says; sampled or not as this server decides, whatever the caller's flag says (see the
    module). This process must trace (:func:`enabled`)."""
    from opentelemetry.trace import SpanKind

    parent = checked_traceparent(traceparent)
    state = (
        tracestate if parent is not None and isinstance(tracestate, str) and _TRACESTATE.fullmatch(tracestate) else None
    )
    context = _context(parent, state)
    return _tracer.start_span(name, context=context, kind=SpanKind.SERVER, attributes=attributes)


def end(span: Any, *, error: str | None = None, attributes: Mapping[str, Any] | None = None) -> None:
    """End ``span`` (None: nothing), with an error status if ``error``."""
    if span is None:
        return
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def traceparent_of(span: Any) -> str | None:
    """The traceparent that makes a span in another process a child of ``span``."""
    if span is None:
        return None
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def recorded_traceparent(span: Any) -> str | None:
    """:func:`traceparent_of` ``span`` if the sampler kept it: the processes after it make
    spans of the request only then, so a trace not sampled costs them nothing."""
    return traceparent_of(span) if span is not None and span.is_recording() else None


def current_traceparent() -> str | None:
    """The traceparent of the span current in this thread or task (an HTTP request's), if any."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    return traceparent_of(trace.get_current_span())


def record(
    name: str,
    parents: Sequence[str],
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, Any],
    steps: Sequence[Step] = (),
    error: str | None = None,
) -> None:
    """A span already over, from ``start_ns`` to ``end_ns``, with ``steps`` as its children,
    once for each of ``parents``: one job run for several requests shows in each one's trace."""
    if _tracer is None:
        return
    from opentelemetry.trace import set_span_in_context

    for parent in dict.fromkeys(parents):
        span = _tracer.start_span(name, context=_context(parent), attributes=attributes, start_time=start_ns)
        under = set_span_in_context(span)
        for step in steps:
            child = _tracer.start_span(step.name, context=under, start_time=step.start_ns)
            child.end(end_time=step.end_ns)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end_ns)


def wall_ns(instant: float) -> int:
    """The wall-clock time (``time.time_ns()``, as spans are stamped) of a ``time.monotonic()`` ``instant``."""
    return time.time_ns() - int((time.monotonic() - instant) * 1e9)


def _decided_here(configured: Any) -> Any:
    """``configured`` (the SDK's sampler, from ``OTEL_TRACES_SAMPLER``), except that under a
    parent-based one a span of kind SERVER that continues a caller's context (an HTTP
    request's: :func:`server_span`) is decided by its root sampler, on a trace id drawn here,
    and keeps the caller's ``tracestate``. Any other span (the head's, a worker's, the sink's)
    is decided by ``configured`` as it is."""
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, SamplingResult
    from opentelemetry.trace import Link, SpanKind, TraceState, get_current_span
    from opentelemetry.util.types import Attributes

    if not isinstance(configured, ParentBased):
        return configured  # it reads no parent's flag: nothing of a caller's to leave out
    draw = RandomIdGenerator().generate_trace_id

    class DecidedHere(Sampler):
        def should_sample(
            self,
            parent_context: Context | None,
            trace_id: int,
            name: str,
            kind: SpanKind | None = None,
            attributes: Attributes = None,
            links: Sequence[Link] | None = None,
            trace_state: TraceState | None = None,
        ) -> SamplingResult:
            if kind is SpanKind.SERVER:
                parent = get_current_span(parent_context).get_span_context()
                if parent.is_valid and parent.is_remote:
                    # An empty context, not None: None would read this task's current span.
                    root = configured.should_sample(Context(), draw(), name, kind, attributes, links)
                    return SamplingResult(root.decision, root.attributes, parent.trace_state)
            return configured.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

        def get_description(self) -> str:
            return f"DecidedHere{{{configured.get_description()}}}"

    return DecidedHere()


@functools.lru_cache(maxsize=256)
def _context(traceparent: str | None, tracestate: str | None = None) -> Any:
    """The OpenTelemetry context whose parent is ``traceparent`` (None: a new trace), read
    straight from its fields: it came through :func:`checked_traceparent` or from a span of
    this server (a frame's is checked by its schema), and the propagator's own parsing took
    a fifth of a span's cost. Kept for a few: a merged job's parts repeat their requests'."""
    if traceparent is None:
        return None
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState, set_span_in_context

    _, trace_id, span_id, flags = traceparent.split("-")
    state = TraceState.from_header([tracestate]) if tracestate else None  # one it cannot read is left out
    parent = SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16)), trace_state=state
    )
    return set_span_in_context(NonRecordingSpan(parent))
