"""Traces in one process, with OpenTelemetry's in-memory exporter: the traceparent a frame may
carry, the spans a head, a worker and a sink make of a request and their parents, and the
telemetry the flags and ``OTEL_*`` variables ask for. The whole trace across a server's four
processes is ``tests/integration/test_observability.py``'s."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from bertserve.client import protocol as p
from bertserve.server import tracing
from bertserve.server.config.telemetry import Telemetry, telemetry_from
from bertserve.server.errors import ConfigError
from bertserve.server.model.prompts import Prompts
from bertserve.server.serving.head.request_options import read_options
from bertserve.server.serving.policy.jobs import Job, Piece
from bertserve.server.serving.protocol import sink
from bertserve.server.serving.worker.traced import JobTimes, traces_of
from bertserve.server.testing.config import server_config
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.install(SimpleSpanProcessor(exporter), "test", "tiny")
    try:
        yield exporter
    finally:
        tracing.shutdown()


def _hex(value: int, width: int) -> str:
    return f"{value:0{width}x}"


# -- the traceparent a frame carries -------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        PARENT,
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",  # not sampled: still a context
    ],
)
def test_a_w3c_traceparent_is_taken(value: str) -> None:
    assert tracing.checked_traceparent(value) == value


@pytest.mark.parametrize(
    "value",
    [
        None,
        42,
        ["00-..."],
        "",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # another version
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # a trace id of zeros
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # a parent id of zeros
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        PARENT + "-extra",
        PARENT + "\n",
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # a digit short
        "x" * 100_000,
    ],
)
def test_anything_else_is_not_followed(value: Any) -> None:
    assert tracing.checked_traceparent(value) is None


def test_an_encode_header_with_a_malformed_traceparent_is_refused_by_name() -> None:
    config = server_config("")
    good = read_options({p.TRACEPARENT_FIELD: PARENT}, config, {"task": "embed"}, Prompts())
    assert getattr(good, "trace", None) == PARENT
    for bad in ("00-zz", 7, {"a": 1}, "y" * 10_000):
        refusal = read_options({p.TRACEPARENT_FIELD: bad}, config, {"task": "embed"}, Prompts())
        assert getattr(refusal, "kind", None) == "protocol", bad
        assert "traceparent must be a W3C traceparent" in refusal.message  # type: ignore[union-attr]
        assert len(refusal.message) < 200  # type: ignore[union-attr]  # a huge value is not echoed whole


def test_the_sinks_register_takes_only_a_traceparent() -> None:
    fields = {"key": "k@1", "client": "ab", "request_id": 1, "count": 1, "deadline": 2.0, "admitted": 1.0}
    assert sink.Register(**fields, trace=PARENT).trace == PARENT
    assert sink.Register(**fields).trace is None
    for bad in ("00-zz", "x" * 300, PARENT.upper()):
        with pytest.raises(ValidationError):
            sink.Register(**fields, trace=bad)


def test_a_jobs_parts_carry_the_trace_of_a_traced_request_only() -> None:
    def piece(key: str, trace: str | None) -> Piece:
        return Piece(key, b"c", np.arange(2), ["a", "b"], False, False, 0.0, trace=trace)

    job = Job("7", [piece("one", PARENT), piece("two", None)], bulk=False)
    parts = job.header(0.0)["parts"]
    assert parts == [{"key": "one", "rows": [0, 1], "trace": PARENT}, {"key": "two", "rows": [0, 1]}]


# -- off: nothing is made ------------------------------------------------------------------


def test_while_tracing_is_off_nothing_is_made_or_carried() -> None:
    assert not tracing.enabled()
    assert tracing.start("x", parent=PARENT) is None
    assert tracing.current_traceparent() is None
    tracing.end(None, error="ignored")
    tracing.record("x", [PARENT], 1, 2, {})
    assert traces_of([{"key": "a", "rows": [0], "trace": PARENT}]) == []  # a worker that does not trace


# -- on: spans and their parents ---------------------------------------------------------


def test_a_span_continues_the_callers_trace(spans: InMemorySpanExporter) -> None:
    span = tracing.start("bertserve.head.request", parent=PARENT, attributes={"bertserve.model": "tiny"})
    child = tracing.traceparent_of(span)
    assert child is not None and child.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
    assert tracing.recorded_traceparent(span) == child
    tracing.end(span, error="expired: past its deadline")
    (done,) = spans.get_finished_spans()
    assert done.parent is not None and _hex(done.parent.span_id, 16) == "00f067aa0ba902b7"
    assert done.status.status_code.name == "ERROR" and done.status.description == "expired: past its deadline"
    assert done.resource.attributes["bertserve.role"] == "test"
    assert done.resource.attributes["bertserve.model"] == "tiny"
    assert done.resource.attributes["service.name"] == "bertserve"


def test_a_trace_the_caller_did_not_sample_goes_no_further(spans: InMemorySpanExporter) -> None:
    span = tracing.start("bertserve.head.request", parent=PARENT[:-2] + "00")
    assert tracing.recorded_traceparent(span) is None  # so no worker or sink span is made of it
    tracing.end(span)
    assert spans.get_finished_spans() == ()


def test_a_job_of_several_requests_shows_in_each_ones_trace(spans: InMemorySpanExporter) -> None:
    """A worker runs one merged job for two traced requests and an untraced one: each traced
    request's trace gets the job's span, with the tokenizing and the model run under it."""
    second = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    started = time.time_ns()
    header = {
        "parts": [
            {"key": "a", "rows": [0], "trace": PARENT},
            {"key": "b", "rows": [0]},
            {"key": "c", "rows": [0, 1], "trace": second},
            {"key": "d", "rows": [0], "trace": "00-bogus"},  # not followed
        ],
        "tokenized_ns": [started, started + 1000],
    }
    times = JobTimes(header)
    times.ran(time.time_ns())

    class Worker:
        index = 3
        config = server_config("", served_model_name="tiny")

    times.record(Worker(), b"job-9", np.zeros((5, 12), np.int32), 60, None)
    finished = spans.get_finished_spans()
    jobs = [span for span in finished if span.name == "bertserve.worker.job"]
    assert sorted(_hex(span.context.trace_id, 32) for span in jobs) == sorted([PARENT[3:35], second[3:35]])
    for job in jobs:
        assert job.attributes is not None
        assert job.attributes["bertserve.batch_size"] == 5 and job.attributes["bertserve.padded_length"] == 12
        assert job.attributes["bertserve.model"] == "tiny" and job.attributes["bertserve.job"] == "job-9"
        steps = [span for span in finished if span.parent is not None and span.parent.span_id == job.context.span_id]
        assert sorted(step.name for step in steps) == ["bertserve.worker.model_run", "bertserve.worker.tokenize"]
        assert all(job.start_time <= step.start_time <= step.end_time <= job.end_time for step in steps)  # type: ignore[operator]


def test_a_failed_job_marks_its_span(spans: InMemorySpanExporter) -> None:
    times = JobTimes({"parts": [{"key": "a", "rows": [0], "trace": PARENT}]})

    class Worker:
        index = 0
        config = server_config("")

    times.record(Worker(), b"1", np.zeros((1, 4), np.int32), 0, "the worker failed on this request: boom")
    (job,) = spans.get_finished_spans()  # neither tokenized nor run: no steps
    assert job.status.status_code.name == "ERROR"
    assert "bertserve.model" not in (job.attributes or {})


# -- what the flags and the environment ask for -------------------------------------------


def test_traces_are_off_unless_asked() -> None:
    telemetry = telemetry_from(verbose=False, environ={})
    assert telemetry == Telemetry(logging.INFO, "text", None) and not telemetry.tracing


def test_the_endpoint_comes_from_the_flag_or_the_standard_variables() -> None:
    assert telemetry_from(verbose=True, otlp_endpoint="http://127.0.0.1:4318", environ={}).traces_endpoint == (
        "http://127.0.0.1:4318/v1/traces"
    )
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318/"}
    assert telemetry_from(verbose=False, environ=base).traces_endpoint == "https://collector:4318/v1/traces"
    full = {**base, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://other:9999/custom"}
    assert telemetry_from(verbose=False, environ=full).traces_endpoint == "http://other:9999/custom"  # as given
    flag_wins = telemetry_from(verbose=False, otlp_endpoint="http://flag:4318", environ=full)
    assert flag_wins.traces_endpoint == "http://flag:4318/v1/traces"
    off = {**full, "OTEL_SDK_DISABLED": "true"}
    assert telemetry_from(verbose=False, otlp_endpoint="http://flag:4318", environ=off).traces_endpoint is None


@pytest.mark.parametrize(
    ("flag", "environ", "says"),
    [
        ("localhost:4318", {}, "must be an http:// or https:// URL"),
        ("ftp://collector:4318", {}, "must be an http:// or https:// URL"),
        ("http://collector:99999", {}, "must be an http:// or https:// URL"),
        ("http://:4318", {}, "must be an http:// or https:// URL"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector"}, "OTEL_EXPORTER_OTLP_ENDPOINT must be"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "='grpc'"),
        (
            None,
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
            "OTLP/HTTP port (4318",
        ),
    ],
)
def test_an_endpoint_that_cannot_work_is_refused_by_name(flag: str | None, environ: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        telemetry_from(verbose=False, otlp_endpoint=flag, environ=environ)
    assert says in str(caught.value)


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(ConfigError, match="log_format must be one of text, json"):
        Telemetry(log_format="yaml")


def test_a_traced_part_stays_within_what_a_result_header_allows_a_part() -> None:
    """A worker's RESULT repeats the job's parts, a traced one's traceparent included: the
    longest key with a trace still fits the bytes the head allows each part."""
    from bertserve.server.serving.protocol.link import RESULT_HEADER_PART_BYTES

    part = {"key": "k" * 256, "rows": [], "trace": PARENT}
    assert len(p.dumps({"parts": [part]})) - len(p.dumps({"parts": []})) + 1 <= RESULT_HEADER_PART_BYTES


@pytest.mark.parametrize(
    ("tracestate", "kept"),
    [
        ("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", ["congo", "rojo"]),
        ("tenant@vendor=x y", ["tenant@vendor"]),
        ("%%%bad", []),  # dropped unlogged: a caller cannot make every request log a warning
        ("a=b," + ",".join(f"k{i}=v" for i in range(40)), []),  # more than 32 members
        ("a=" + "v" * 300, []),
        (None, []),
    ],
)
def test_an_http_requests_span_continues_the_callers_context(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture, tracestate: str | None, kept: list[str]
) -> None:
    span = tracing.server_span("POST /v1/embeddings", PARENT, tracestate, {"url.path": "/v1/embeddings"})
    span.end()
    (done,) = spans.get_finished_spans()
    assert done.kind.name == "SERVER" and done.parent is not None and _hex(done.parent.span_id, 16) == PARENT[36:52]
    assert list(done.context.trace_state.keys()) == kept
    assert not [record for record in caplog.records if record.name.startswith("opentelemetry")]


@pytest.mark.parametrize("traceparent", [None, "garbage", PARENT.upper(), 7])
def test_an_http_request_with_no_readable_traceparent_starts_a_trace(
    spans: InMemorySpanExporter, traceparent: Any
) -> None:
    span = tracing.server_span("POST", traceparent, "a=b", {})
    span.end()
    (done,) = spans.get_finished_spans()
    assert done.parent is None and list(done.context.trace_state.keys()) == []


def test_the_traces_own_protocol_variable_wins_and_the_flag_needs_none() -> None:
    own = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",  # for the other signals of a pod's other programs
    }
    assert telemetry_from(verbose=False, environ=own).traces_endpoint == "http://c:4318/v1/traces"
    flag = telemetry_from(
        verbose=False, otlp_endpoint="http://c:4318/v1/traces", environ={"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    )
    assert flag.traces_endpoint == "http://c:4318/v1/traces"  # the full URL taken as it is, and the flag says OTLP/HTTP


def test_settings_the_sdk_refuses_are_refused_at_start_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "5000")
    with pytest.raises(ConfigError, match=r"OpenTelemetry's settings \(OTEL_BSP_\*.*max_export_batch_size"):
        tracing.check("http://127.0.0.1:4318/v1/traces")
    monkeypatch.delenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
    tracing.check("http://127.0.0.1:4318/v1/traces")
    assert not tracing.enabled()  # a check sets nothing up


def test_a_client_command_reads_no_otel_variable() -> None:
    """A pod's OTEL_* variables, set for its other programs, are no business of `bertserve status`."""
    import os
    import subprocess
    import sys

    from bertserve.server.testing.launcher import free_port

    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    command = [sys.executable, "-m", "bertserve.server.cli", "status", "--port", str(free_port()), "--timeout", "300"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert "no bertserve server answered" in done.stderr and "grpc" not in done.stderr, done.stderr
