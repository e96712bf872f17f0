"""The gRPC front end's edges, attacked with TEI's own generated stubs: mutual TLS, API keys in
the metadata, a 20 MB message, 10,000 streams opened and left idle, a stream cancelled half
way, a deadline shorter than the work, bytes that are no message. Each is answered with its
status code, names the problem, and takes nothing from another principal's calls, which are
answered meanwhile; the server serves on after each.

One server of the fast model (PacedModel: HashingModel's vectors, 50 ms a model run) with two
principals, alice and bob, whose certificates one test CA signed (``trustme``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import grpc
import httpx
import pytest
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from faulty_model import SLOW_WORD, pythonpath_env
from tei_stubs import tei_stubs

pytestmark = pytest.mark.timeout(300)

pb, services = tei_stubs()
KEYS = {"alice": "alice-key-0123456789", "bob": "bob-key-0123456789"}
PER_PRINCIPAL = 40
IDLE_S = 2


@dataclass
class Edge:
    running: RunningServer
    grpc_port: int
    http: str
    ca: bytes
    client_key: bytes
    client_cert: bytes

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.client_key, self.client_cert)

    def channel(self) -> grpc.Channel:
        return grpc.secure_channel(f"127.0.0.1:{self.grpc_port}", self.credentials())

    def status(self) -> dict:
        headers = {"Authorization": f"Bearer {KEYS['bob']}"}
        return httpx.get(self.http + "/status", headers=headers, timeout=10).json()


def key(name: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {KEYS[name]}")]


@pytest.fixture(scope="module")
def edge(tiny_google: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    trustme = pytest.importorskip("trustme")
    folder = tmp_path_factory.mktemp("grpc_edge")
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    client_cert = ca.issue_cert("alice@clients.test")
    files = {
        "cert.pem": server_cert.cert_chain_pems[0].bytes(),
        "key.pem": server_cert.private_key_pem.bytes(),
        "ca.pem": ca.cert_pem.bytes(),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "keys").write_text("".join(f"{name} {secret}\n" for name, secret in KEYS.items()))
    (folder / "keys").chmod(0o600)
    grpc_port, http_port = free_port(), free_port()
    running = start_server(
        *("--model-dir", tiny_google, "--model-class", "faulty_model:PacedModel", "--max-seq-len", "32"),
        *("--grpc-port", str(grpc_port), "--http-port", str(http_port), "--api-keys", str(folder / "keys")),
        *("--grpc-tls-cert", str(folder / "cert.pem"), "--grpc-tls-key", str(folder / "key.pem")),
        *("--grpc-tls-client-ca", str(folder / "ca.pem"), "--max-grpc-calls-per-principal", str(PER_PRINCIPAL)),
        *("--grpc-idle-timeout-s", str(IDLE_S), "--max-message-bytes", str(16 * 2**20)),
        env=pythonpath_env(),
    )
    yield Edge(
        running,
        grpc_port,
        f"http://127.0.0.1:{http_port}",
        files["ca.pem"],
        client_cert.private_key_pem.bytes(),
        client_cert.cert_chain_pems[0].bytes(),
    )
    running.stop()


def _embed(channel: grpc.Channel, who: str, text: str = "a sentence", timeout: float = 30) -> list[float]:
    return list(
        services.EmbedStub(channel).Embed(pb.EmbedRequest(inputs=text), metadata=key(who), timeout=timeout).embeddings
    )


def _refused(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as failed:
        call()  # type: ignore[operator]
    return failed.value


def test_only_tls_with_a_certificate_of_the_ca_gets_in(edge: Edge) -> None:
    with edge.channel() as channel:
        assert len(_embed(channel, "alice")) > 0
    other_ca = pytest.importorskip("trustme").CA()
    stranger = other_ca.issue_cert("mallory@clients.test")
    attempts = {
        "plain": grpc.insecure_channel(f"127.0.0.1:{edge.grpc_port}"),
        "no client certificate": grpc.secure_channel(
            f"127.0.0.1:{edge.grpc_port}", grpc.ssl_channel_credentials(edge.ca)
        ),
        "a certificate of another CA": grpc.secure_channel(
            f"127.0.0.1:{edge.grpc_port}",
            grpc.ssl_channel_credentials(
                edge.ca, stranger.private_key_pem.bytes(), stranger.cert_chain_pems[0].bytes()
            ),
        ),
    }
    for how, channel in attempts.items():
        with channel:
            failed = _refused(lambda channel=channel: _embed(channel, "alice", timeout=5))
            assert failed.code() is grpc.StatusCode.UNAVAILABLE, (how, failed.details())


def test_a_missing_or_wrong_key_is_unauthenticated(edge: Edge) -> None:
    embed = pb.EmbedRequest(inputs="x")
    with edge.channel() as channel:
        stub = services.EmbedStub(channel)
        for metadata, said in [
            ([], "an API key is needed"),
            ([("authorization", "Bearer not-a-key-at-all")], "not valid"),
            ([("authorization", f"Basic {KEYS['alice']}")], "Bearer KEY"),
            ([("authorization", "Bearer " + "k" * 5000)], "Bearer KEY"),
            ([("authorization", f"bearer {KEYS['alice']}")], None),  # the scheme in any case
        ]:
            if said is None:
                assert stub.Embed(embed, metadata=metadata, timeout=10).embeddings
                continue
            failed = _refused(lambda metadata=metadata: stub.Embed(embed, metadata=metadata, timeout=10))
            assert failed.code() is grpc.StatusCode.UNAUTHENTICATED and said in failed.details()
        assert len(_embed(channel, "bob")) > 0


def test_a_20_mb_message_is_refused_while_another_principal_is_answered(edge: Edge) -> None:
    with edge.channel() as channel:
        texts = [f"bob's sentence {i}" for i in range(300)]
        answers: list[int] = []

        def bob() -> None:
            stream = services.EmbedStub(channel).EmbedStream(
                iter(pb.EmbedRequest(inputs=t) for t in texts), metadata=key("bob"), timeout=60
            )
            answers.extend(len(a.embeddings) for a in stream)

        worker = threading.Thread(target=bob)
        worker.start()
        failed = _refused(lambda: _embed(channel, "alice", "x" * 20_000_000))
        worker.join(60)
        assert failed.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, failed.details()
        assert len(answers) == len(texts) and len(set(answers)) == 1
        assert len(_embed(channel, "alice")) == answers[0]


def test_ten_thousand_idle_streams_end_in_bounded_time_and_take_nothing_from_another_principal(edge: Edge) -> None:
    async def flood() -> tuple[dict[str, int], float, float]:
        never = asyncio.Event()

        async def nothing() -> AsyncIterator[pb.EmbedRequest]:
            await never.wait()
            yield pb.EmbedRequest(inputs="never sent")

        channels = [grpc.aio.secure_channel(f"127.0.0.1:{edge.grpc_port}", edge.credentials()) for _ in range(10)]
        ended: dict[str, int] = {}

        async def idle(i: int) -> None:
            call = services.EmbedStub(channels[i % len(channels)]).EmbedStream(
                nothing(), metadata=key("alice"), timeout=90
            )
            try:
                async for _ in call:
                    pass
                ended["answered"] = ended.get("answered", 0) + 1
            except grpc.aio.AioRpcError as exc:
                kind = exc.code().name
                if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED and "sent nothing" not in exc.details():
                    kind = "client deadline"
                if exc.code() is grpc.StatusCode.UNAVAILABLE and "error code 7" in exc.details():
                    kind = "REFUSED_STREAM"  # past --max-grpc-streams on a connection, before the client knew it
                ended[kind] = ended.get(kind, 0) + 1

        started = time.monotonic()
        flood = asyncio.gather(*(idle(i) for i in range(10_000)))
        await asyncio.sleep(1)  # alice's share is taken: bob is served meanwhile, on his own connection
        async with grpc.aio.secure_channel(f"127.0.0.1:{edge.grpc_port}", edge.credentials()) as own:
            asked = time.monotonic()
            answer = await services.EmbedStub(own).Embed(pb.EmbedRequest(inputs="bob"), metadata=key("bob"), timeout=20)
            bob_s = time.monotonic() - asked
            assert answer.embeddings
        await flood
        took = time.monotonic() - started
        never.set()
        for channel in channels:
            await channel.close()
        return ended, took, bob_s

    ended, took, bob_s = asyncio.run(flood())
    assert sum(ended.values()) == 10_000
    assert set(ended) <= {"RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "REFUSED_STREAM"}, ended
    assert ended.get("DEADLINE_EXCEEDED", 0) >= PER_PRINCIPAL  # the idle streams it let in were ended
    assert took < 120 and bob_s < 10, (took, bob_s)
    with edge.channel() as channel:
        assert len(_embed(channel, "alice")) > 0  # alice's share is hers again


def test_a_stream_cancelled_half_way_withdraws_its_work(edge: Edge) -> None:
    """10,000 messages whose model runs take a second each (SLOWME): answered whole, the head
    would be busy with them for over half a minute; cancelled after 50 answers, what the head
    held of them is withdrawn at once, and the server answers the next call."""
    before = edge.status()
    with edge.channel() as channel:
        stream = services.EmbedStub(channel).EmbedStream(
            iter(pb.EmbedRequest(inputs=f"{SLOW_WORD} sentence {i}") for i in range(10_000)),
            metadata=key("alice"),
            timeout=120,
        )
        for taken, _ in enumerate(stream, 1):
            if taken == 50:
                stream.cancel()
                break
        cancelled_at = time.monotonic()
        while time.monotonic() < cancelled_at + 8:  # the groups in flight alone would take 16 s
            status = edge.status()
            if status["requests_pending"] == 0:
                break
            time.sleep(0.2)
        assert status["requests_pending"] == 0, status  # withdrawn, not worked through
        assert status["requests_received"] - before["requests_received"] < 12  # groups, not 10,000 requests
        assert len(_embed(channel, "alice")) > 0


def test_a_deadline_shorter_than_the_work_is_deadline_exceeded(edge: Edge) -> None:
    with edge.channel() as channel:
        started = time.monotonic()
        failed = _refused(lambda: _embed(channel, "alice", f"this {SLOW_WORD} run takes a second", timeout=0.3))
        assert failed.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 1.0
        assert len(_embed(channel, "alice")) > 0


def test_bytes_that_are_no_message_are_refused_and_the_server_serves_on(edge: Edge) -> None:
    with edge.channel() as channel:
        raw = channel.unary_unary("/tei.v1.Embed/Embed", request_serializer=None, response_deserializer=None)
        for junk in (b"\x0a\x03\xff\xfe\xfd", b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f"):
            failed = _refused(lambda junk=junk: raw(junk, metadata=key("alice"), timeout=10))
            assert failed.code() is grpc.StatusCode.INVALID_ARGUMENT, failed.details()
            assert "not a valid tei.v1.EmbedRequest" in failed.details()
        streamed = channel.stream_stream(
            "/tei.v1.Embed/EmbedStream", request_serializer=None, response_deserializer=None
        )
        good = pb.EmbedRequest(inputs="fine").SerializeToString()
        replies: list[bytes] = []
        with pytest.raises(grpc.RpcError) as failed_stream:
            for reply in streamed(iter([good, b"\x0a\x03\xff\xfe\xfd", good]), metadata=key("alice"), timeout=10):
                replies.append(reply)
        assert failed_stream.value.code() is grpc.StatusCode.INVALID_ARGUMENT, failed_stream.value.details()
        unknown = channel.unary_unary("/tei.v1.Embed/Nothing", request_serializer=None, response_deserializer=None)
        assert _refused(lambda: unknown(b"", metadata=key("alice"), timeout=10)).code() is grpc.StatusCode.UNIMPLEMENTED
        assert len(_embed(channel, "alice")) > 0


def test_each_call_is_counted_in_the_metrics(edge: Edge) -> None:
    with edge.channel() as channel:
        _embed(channel, "bob")
        _refused(lambda: services.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="x"), timeout=10))
    text = httpx.get(edge.http + "/metrics", headers={"Authorization": f"Bearer {KEYS['bob']}"}, timeout=10).text
    assert 'bertserve_grpc_calls_total{code="OK",method="tei.v1.Embed/Embed"}' in text
    assert 'bertserve_grpc_calls_total{code="UNAUTHENTICATED",method="tei.v1.Embed/Embed"}' in text
    assert "bertserve_requests_total{model=" in text and 'path="grpc"' in text


def test_the_key_is_never_in_an_answer(edge: Edge) -> None:
    with edge.channel() as channel:
        failed = _refused(
            lambda: services.EmbedStub(channel).Embed(
                pb.EmbedRequest(inputs="x"), metadata=[("authorization", "Bearer alice-key-0123456788")], timeout=10
            )
        )
    assert "alice-key" not in failed.details()
