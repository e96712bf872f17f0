"""A real OTLP/HTTP receiver on loopback, for the traces tests and the tracing benchmark: it takes what an exporter
POSTs to ``/v1/traces`` (an ``ExportTraceServiceRequest`` in protobuf, gzip or not, decoded
with ``opentelemetry-proto``, the collector's own schema) and keeps each span with its
resource's attributes."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


class Receiver:
    """What came: each POST's body is kept as it arrived and decoded only when :attr:`spans`
    is read, so a receiver on the same machine as a server it measures costs it little."""

    def __init__(self) -> None:
        self.requests = 0
        self._bodies: list[bytes] = []
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()

    def take(self, body: bytes) -> None:
        with self._lock:
            self.requests += 1
            self._bodies.append(body)

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            bodies, self._bodies = self._bodies, []
            for body in bodies:
                self._spans.extend(_decoded(body))
            return list(self._spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [span for span in self.spans if span.trace_id == trace_id]

    def wait_for(self, trace_id: str, names: set[str], timeout_s: float = 30.0) -> list[ReceivedSpan]:
        """The spans of ``trace_id`` once each of ``names`` is among them (or what came by the timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if names <= {span.name for span in spans}:
                return spans
            time.sleep(0.1)
        return self.trace(trace_id)


def _decoded(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        span.name,
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        span.parent_span_id.hex(),
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        _attributes(span.attributes),
                        resource,
                        span.status.code,
                    )
                )
    return spans


@contextmanager
def otlp_receiver() -> Iterator[tuple[Receiver, str]]:
    """A receiver listening on a free loopback port, and its base URL (``http://127.0.0.1:PORT``)."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            receiver.take(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
