"""Traces, JSON logs and CORS through a real server: one ``bertserve start`` with the fast
HashingModel, its HTTP API behind an API key, sending its spans to a real OTLP/HTTP receiver
on loopback (:mod:`otlp_receiver`), logging JSON (``-v``: every process has lines to write),
and letting one origin's pages call it. Then a head whose worker joined it from
``bertserve worker``: the trace crosses the link too.

A trace is asserted whole: a span from each of the four processes (HTTP, head, worker, sink),
each the child of the span that handed it the request, under the caller's own span."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc
import httpx
import pytest
import zmq
from bertserve.client import BertClient, protocol as p
from bertserve.server.testing.launcher import (
    RunningServer,
    ServerStartError,
    free_port,
    start_head,
    start_server,
    start_worker_host,
)
from bertserve.server.testing.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver
from tei_stubs import tei_stubs

pytestmark = pytest.mark.timeout(180)
T = TypeVar("T")

HASHING = "bertserve.server.model.interface:HashingModel"
KEY = "observability-test-key"
ORIGIN = "https://app.example.com"
WHOLE = {
    "POST /v1/embeddings",
    "bertserve.head.request",
    "bertserve.head.queue",
    "bertserve.worker.job",
    "bertserve.worker.tokenize",
    "bertserve.worker.model_run",
    "bertserve.sink.reply",
}
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # each process sends its spans within 0.1 s


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, str]]:
    with otlp_receiver() as found:
        yield found


@pytest.fixture(scope="module")
def grpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def served(receiver: tuple[Receiver, str], tiny_google: str, grpc_port: int) -> Iterator[tuple[RunningServer, int]]:
    http_port = free_port()
    server = start_server(
        "-v",
        "--grpc-port",
        str(grpc_port),
        "--model-dir",
        tiny_google,
        "--model-class",
        HASHING,
        "--http-port",
        str(http_port),
        "--otlp-endpoint",
        receiver[1],
        "--log-format",
        "json",
        "--cors-allow-origin",
        ORIGIN,
        env={**FAST_EXPORT, "BERTSERVE_API_KEY": KEY},
        expect_ready=False,
    )
    server.is_ready_line = _json_ready_line  # long before the ready line, which takes seconds
    try:
        server.wait_ready(60)
    except ServerStartError:
        server.terminate()
        server.wait_stopped()
        raise
    yield server, http_port
    server.stop()


def _json_ready_line(line: str) -> bool:
    """With ``--log-format json`` the ready line is a JSON line too, its ``event`` ``ready``."""
    return line.startswith("{") and json.loads(line).get("event") == "ready"


def _post(port: int, body: dict[str, Any], trace_id: str, parent_id: str = "00f067aa0ba902b7") -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/embeddings",
        json=body,
        headers={"Authorization": f"Bearer {KEY}", "traceparent": f"00-{trace_id}-{parent_id}-01"},
        timeout=30,
    )


def _eventually(find: Callable[[], T | None], timeout_s: float = 30.0) -> T:
    """What ``find`` returns once it is not None, within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (found := find()) is None:
        assert time.monotonic() < deadline, "not found in time"
        time.sleep(0.05)
    return found


def _by_name(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    named: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


def _assert_whole(spans: list[ReceivedSpan], caller_span: str | None, inputs: int) -> None:
    """The request's spans: HTTP (if ``caller_span`` is the HTTP caller's) → head → its queue,
    the worker's job (→ tokenize, model run) and the sink's reply, each parented so."""
    named = _by_name(spans)
    (request,) = named["bertserve.head.request"]
    if caller_span is not None:
        (http,) = named["POST /v1/embeddings"]
        assert http.parent_id == caller_span
        assert http.resource["bertserve.role"] == "http"
        assert request.parent_id == http.span_id
        assert http.attributes["http.response.status_code"] == 200 and http.attributes["http.route"] == "/v1/embeddings"
    assert request.resource["bertserve.role"] == "head"
    assert request.attributes["bertserve.inputs"] == inputs
    assert isinstance(request.attributes["bertserve.model"], str)
    for queue in named["bertserve.head.queue"]:
        assert queue.parent_id == request.span_id and queue.resource["bertserve.role"] == "head"
    jobs = named["bertserve.worker.job"]
    assert jobs and sum(job.attributes["bertserve.batch_size"] >= 1 for job in jobs) == len(jobs)
    for job in jobs:
        assert job.parent_id == request.span_id and job.resource["bertserve.role"] == "worker"
        assert job.attributes["bertserve.padded_length"] >= 3  # [CLS] a word [SEP]
        assert job.attributes["bertserve.model"] == request.attributes["bertserve.model"]
        steps = [span for span in spans if span.parent_id == job.span_id]
        assert sorted(step.name for step in steps) == ["bertserve.worker.model_run", "bertserve.worker.tokenize"]
        assert all(job.start_ns <= step.start_ns <= step.end_ns <= job.end_ns for step in steps)
    (reply,) = named["bertserve.sink.reply"]
    assert reply.parent_id == request.span_id and reply.resource["bertserve.role"] == "sink"
    assert reply.attributes["bertserve.rows"] == inputs and reply.attributes["bertserve.outcome"] == "ok"
    assert request.start_ns <= reply.start_ns and reply.end_ns <= request.end_ns + 50_000_000  # clocks of one machine
    assert {span.resource["bertserve.role"] for span in spans} >= {"head", "worker", "sink"}


# -- traces ----------------------------------------------------------------------------------


def test_a_traced_http_request_is_one_trace_across_four_processes(served, receiver) -> None:
    _, port = served
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    answer = _post(port, {"input": ["hello world", "a second sentence here"]}, trace_id)
    assert answer.status_code == 200, answer.text
    spans = receiver[0].wait_for(trace_id, WHOLE)
    assert {span.name for span in spans} >= WHOLE, sorted(span.name for span in spans)
    _assert_whole(spans, "00f067aa0ba902b7", inputs=2)
    roles = {span.resource["bertserve.role"] for span in spans}
    assert roles == {"http", "head", "worker", "sink"}
    assert len({span.resource["process.pid"] for span in spans}) == 4


def test_a_traced_grpc_call_is_one_trace_its_span_the_child_of_the_metadatas(served, receiver, grpc_port) -> None:
    pb, services = tei_stubs()
    trace_id = "5cf92f3577b34da6a3ce929d0e0e4737"
    metadata = [("authorization", f"Bearer {KEY}"), ("traceparent", f"00-{trace_id}-00f067aa0ba902b8-01")]
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        assert services.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="hello world"), metadata=metadata).embeddings
    whole = (WHOLE - {"POST /v1/embeddings"}) | {"tei.v1.Embed/Embed"}
    spans = receiver[0].wait_for(trace_id, whole)
    named = _by_name(spans)
    (call,) = named["tei.v1.Embed/Embed"]
    (request,) = named["bertserve.head.request"]
    assert call.parent_id == "00f067aa0ba902b8" and call.resource["bertserve.role"] == "grpc"
    assert call.attributes["rpc.system"] == "grpc" and call.attributes["rpc.grpc.status_code"] == 0
    assert request.parent_id == call.span_id
    _assert_whole(spans, None, inputs=1)


def test_concurrent_traced_requests_each_get_their_own_whole_trace(served, receiver) -> None:
    """Requests at once, which the head may merge into one job: each trace still has its
    worker's spans, under its own head span, and no span of another request."""
    _, port = served
    trace_ids = [f"{i + 1:032x}" for i in range(12)]
    answers: dict[str, int] = {}

    def send(trace_id: str) -> None:
        answers[trace_id] = _post(
            port, {"input": [f"sentence {trace_id}", "and another"], "truncate": True}, trace_id
        ).status_code

    threads = [threading.Thread(target=send, args=(trace_id,)) for trace_id in trace_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == dict.fromkeys(trace_ids, 200)
    for trace_id in trace_ids:
        spans = receiver[0].wait_for(trace_id, WHOLE)
        _assert_whole(spans, "00f067aa0ba902b7", inputs=2)


def test_a_zeromq_request_starts_its_own_trace_and_a_bad_traceparent_is_refused(served, receiver) -> None:
    server, _ = served
    with BertClient("127.0.0.1", server.port, server.port_out, timeout=30_000) as client:
        assert client.encode(["from the zeromq client"]).shape[0] == 1
    rec = receiver[0]
    root = _eventually(
        lambda: next(
            (
                s
                for s in rec.spans
                if s.name == "bertserve.head.request" and s.parent_id == "" and s.attributes["bertserve.inputs"] == 1
            ),
            None,
        )
    )
    _assert_whole(rec.wait_for(root.trace_id, WHOLE - {"POST /v1/embeddings"}), None, inputs=1)

    # Raw ENCODE frames: a caller's traceparent is continued; one of another form is refused by name.
    context = zmq.Context.instance()
    push, sub = context.socket(zmq.PUSH), context.socket(zmq.SUB)
    client_id = b"tracing-raw-client"
    try:
        push.connect(f"tcp://127.0.0.1:{server.port}")
        sub.connect(f"tcp://127.0.0.1:{server.port_out}")
        sub.subscribe(client_id)
        answers = []
        for request_id, traceparent in enumerate(
            ["00-abcdefabcdefabcdefabcdefabcdef01-1111111111111111-01", "00-" + "a" * 31 + "-zz-01"], start=1
        ):
            for _ in range(50):  # until the subscription has reached the sink
                push.send_multipart(
                    p.encode_request(client_id, p.ENCODE, request_id, {p.TRACEPARENT_FIELD: traceparent}, ["raw"])
                )
                if sub.poll(200):
                    answers.append(p.decode_reply(sub.recv_multipart()))
                    break
                request_id += 100
    finally:
        push.close(0)
        sub.close(0)
    assert answers[0].ok
    continued = rec.wait_for("abcdefabcdefabcdefabcdefabcdef01", WHOLE - {"POST /v1/embeddings"})
    _assert_whole(continued, None, inputs=1)
    (request,) = _by_name(continued)["bertserve.head.request"]
    assert request.parent_id == "1111111111111111"
    assert not answers[1].ok and answers[1].header["kind"] == "protocol"
    assert "traceparent must be a W3C traceparent" in answers[1].header["error"]


def test_an_http_request_with_a_malformed_traceparent_is_a_trace_of_its_own(served, receiver) -> None:
    """A traceparent that is not one is ignored, as W3C says: the request is the root of a new trace."""
    _, port = served
    rec = receiver[0]
    before = {span.span_id for span in rec.spans}
    answer = httpx.post(
        f"http://127.0.0.1:{port}/v1/embeddings",
        json={"input": ["no parent here", "two", "three"]},
        headers={"Authorization": f"Bearer {KEY}", "traceparent": "00-garbage-01"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    root = _eventually(
        lambda: next(
            (s for s in rec.spans if s.name == "POST /v1/embeddings" and s.parent_id == "" and s.span_id not in before),
            None,
        )
    )
    _assert_whole(rec.wait_for(root.trace_id, WHOLE), "", inputs=3)


# -- CORS ------------------------------------------------------------------------------------


def test_a_preflight_from_the_allowed_origin_passes_without_the_key(served) -> None:
    _, port = served
    preflight = httpx.options(
        f"http://127.0.0.1:{port}/v1/embeddings",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, traceparent",
        },
    )
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert len(preflight.headers["x-request-id"]) == 32  # answered before the API, and still named
    allowed = preflight.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed
    assert "POST" in preflight.headers["access-control-allow-methods"]

    answer = httpx.post(
        f"http://127.0.0.1:{port}/v1/embeddings",
        json={"input": "from a page"},
        headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"},
    )
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == ORIGIN
    # Without the key the page is refused, and can read why.
    refused = httpx.post(f"http://127.0.0.1:{port}/v1/embeddings", json={"input": "x"}, headers={"Origin": ORIGIN})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == ORIGIN


def test_another_origin_gets_no_cors_headers(served) -> None:
    _, port = served
    preflight = httpx.options(
        f"http://127.0.0.1:{port}/v1/embeddings",
        headers={"Origin": "https://evil.example.com", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 400
    assert "access-control-allow-origin" not in preflight.headers
    answer = httpx.post(
        f"http://127.0.0.1:{port}/v1/embeddings",
        json={"input": "x"},
        headers={"Origin": "https://evil.example.com", "Authorization": f"Bearer {KEY}"},
    )
    assert answer.status_code == 200 and "access-control-allow-origin" not in answer.headers  # the browser hides it


# -- JSON logs -------------------------------------------------------------------------------


def _json_lines(server: RunningServer) -> list[dict[str, Any]]:
    lines = [line for line in server.output if line.strip() and not server.is_ready_line(line)]
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"a log line that is not JSON: {line!r}")
    return parsed


def test_every_process_logs_one_json_object_a_line(served) -> None:
    server, port = served
    url = f"http://127.0.0.1:{port}/v1/embeddings"
    refused = httpx.post(url, json={"input": "logged"}, headers={"Authorization": "x", "X-Request-Id": "req-42.a"})
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "req-42.a"
    served_ = httpx.post(url, json={"input": "x"}, headers={"Authorization": f"Bearer {KEY}", "X-Request-Id": "a b"})
    made = served_.headers["x-request-id"]  # an id that is not a sane one is replaced
    assert served_.status_code == 200 and len(made) == 32 and made != "a b"
    _eventually(lambda: any(f'"{made}"' in line for line in server.output) or None, 10)
    records = _json_lines(server)
    assert {record["role"] for record in records} >= {"head", "http", "worker", "sink"}
    for record in records:
        assert {"time", "level", "role", "pid", "logger", "message", "model", "request_id"} <= set(record)
        assert record["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
    workers = [record for record in records if record["role"] == "worker"]
    assert all(record["model"] for record in workers)  # a worker names the model it serves
    access = [record for record in records if record["logger"] == "uvicorn.access"]
    assert any(
        record["method"] == "POST"
        and record["path"] == "/v1/embeddings"
        and record["status"] == 401
        and record["request_id"] == "req-42.a"
        for record in access
    )
    answered = [record for record in access if record["status"] == 200 and record["request_id"] == made]
    assert answered and answered[0]["model"], access  # the model that answered
    assert answered[0]["message"].endswith(f" model={answered[0]['model']}")


@contextmanager
def _remote_pair(receiver_url: str, tiny_google: str) -> Iterator[tuple[RunningServer, RunningServer, int]]:
    http_port = free_port()
    head, worker_port = start_head(
        "--model-dir",
        tiny_google,
        "--model-class",
        HASHING,
        "--num-worker",
        "0",
        "--http-port",
        str(http_port),
        "--otlp-endpoint",
        receiver_url,
        env=FAST_EXPORT,
        expect_ready=False,
    )
    host = None
    try:
        host = start_worker_host(
            worker_port,
            "--model-dir",
            tiny_google,
            "--cpu",
            "--model-class",
            HASHING,
            "--log-format",
            "json",
            "--otlp-endpoint",
            receiver_url,
            env=FAST_EXPORT,
        )
        head.wait_ready(60)  # its ready line comes before a remote worker has loaded the model: /ready says when
        _eventually(lambda: httpx.get(f"http://127.0.0.1:{http_port}/ready").status_code == 200 or None, 60)
        yield head, host, http_port
    finally:
        if host is not None:
            host.stop()
        head.stop()


def test_a_remote_workers_spans_join_the_trace_and_its_host_logs_json(receiver, tiny_google: str) -> None:
    rec, url = receiver
    with _remote_pair(url, tiny_google) as (_, host, port):
        trace_id = "0123456789abcdef0123456789abcdef"
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/embeddings",
            json={"input": ["over the link"]},
            headers={"traceparent": f"00-{trace_id}-2222222222222222-01"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        spans = rec.wait_for(trace_id, WHOLE)
        _assert_whole(spans, "2222222222222222", inputs=1)
        records = _json_lines(host)
        assert {record["role"] for record in records} >= {"host", "worker"}


def test_a_collector_that_is_down_costs_the_requests_nothing_and_the_stop_little(tiny_google: str) -> None:
    """Spans to a port nobody listens on: the requests are answered as ever, the exporter's
    complaints are log lines in the server's form, and the server still stops within bounds."""
    server = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        HASHING,
        "--otlp-endpoint",
        f"http://127.0.0.1:{free_port()}",
        env=FAST_EXPORT,
        timeout=60,
    )
    try:
        with BertClient("127.0.0.1", server.port, server.port_out, timeout=10_000) as client:
            for i in range(20):
                assert client.encode([f"sentence {i}"]).shape == (1, 16)
        time.sleep(1)  # the exporters try, and fail
    finally:
        started = time.monotonic()
        server.stop()
        stopped_in = time.monotonic() - started
    assert stopped_in < 12, stopped_in
    complaints = [line for line in server.output if "opentelemetry" in line]
    assert complaints and all(line.split()[1] in ("WARNING", "ERROR") for line in complaints), complaints[:3]
