"""Attack: HTTP principals that try to borrow each other's quota, and keys that try to leak.

The server's per-client bound (``--max-client-queued-sentences``) applies to each API key's
principal. The OpenAI ``user`` field is the caller's to choose, so it must count for nothing:
a key holder that varies it still meets its own bound, and one that names another principal
in it neither joins that principal's queue nor eats into its quota.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from faulty_model import expected, pythonpath_env, sentences
from prometheus_client.parser import text_string_to_metric_families

ALICE, BOB, OPS = "alice-key-0123456789abcdef", "bob-key-fedcba9876543210", "ops-key-from-the-env-0123"
REQUEST = 50  # inputs per request; each principal may have 100 queued


@dataclass
class Front:
    running: RunningServer
    url: str
    key_file: Path


@pytest.fixture(scope="module")
def front(tiny_google: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    key_file = tmp_path_factory.mktemp("keys") / "api-keys"
    key_file.write_text(f"# the HTTP principals\nalice {ALICE}\nbob   {BOB}\n")
    key_file.chmod(0o600)
    port = free_port()
    running = start_server(
        "-v",
        "--model-dir",
        tiny_google,
        "--model-class",
        "faulty_model:FaultyModel",
        "--http-port",
        str(port),
        "--api-keys",
        str(key_file),
        "--heartbeat-timeout-ms",
        "60000",
        "--max-request-size",
        str(REQUEST),
        "--max-client-queued-sentences",
        str(2 * REQUEST),
        "--max-queued-sentences",
        "1000",
        "--metrics-principals",
        env=pythonpath_env(BERTSERVE_API_KEY=OPS),
    )
    yield Front(running, f"http://127.0.0.1:{port}", key_file)
    running.stop()


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def principal_counts(front: Front) -> dict[tuple[str, str], float]:
    text = httpx.get(front.url + "/metrics", headers=_headers(OPS), timeout=30).raise_for_status().text
    counts = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "bertserve_http_principal_requests_total":
                counts[(sample.labels["principal"], sample.labels["status"])] = sample.value
    return counts


@pytest.mark.timeout(120)
def test_a_principal_cannot_borrow_quota_by_its_user_field(front: Front) -> None:
    before = principal_counts(front)

    async def attack() -> None:
        async with httpx.AsyncClient(base_url=front.url, timeout=60) as http:

            async def post(key: str, seed: int, user: str | None = None) -> httpx.Response:
                body: dict = {"input": sentences(REQUEST, seed=seed)}
                if user is not None:
                    body["user"] = user
                return await http.post("/v1/embeddings", json=body, headers=_headers(key))

            async def status() -> dict:
                return (await http.get("/status", headers=_headers(OPS))).raise_for_status().json()

            async def until(condition, what: str) -> None:  # type: ignore[no-untyped-def]
                for _ in range(200):
                    if condition(await status()):
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"{what} did not happen in 10 s")

            warm = await http.post("/v1/embeddings", json={"input": "warm up"}, headers=_headers(ALICE))
            assert warm.status_code == 200, warm.text
            # A reply can reach its client before its worker's DONE reaches the head: stopped
            # in between, the worker would keep the warm-up job and its credit.
            await until(lambda s: not s["jobs_in_flight"], "the head taking the warm-up's DONE")
            (worker,) = [w["pid"] for w in (await status())["workers"]]
            os.kill(worker, signal.SIGSTOP)
            pending: list[tuple[asyncio.Task[httpx.Response], int]] = []
            try:
                pending.append((asyncio.create_task(post(ALICE, 1, user="a")), 1))
                await until(lambda s: s["jobs_in_flight"], "alice's first request reaching the stopped worker")
                for seed, user in ((2, "b"), (3, "c")):
                    pending.append((asyncio.create_task(post(ALICE, seed, user=user)), seed))
                await until(lambda s: s["queued_sentences"] == 2 * REQUEST, "alice's quota filling")

                # alice, whatever she calls herself, is alice: her bound holds
                for user in ("d", "bob", None, "default"):
                    refused = await post(ALICE, 9, user=user)
                    assert refused.status_code == 429, (user, refused.text)
                    assert "this client already has 100 inputs queued" in refused.json()["error"]["message"]

                # bob, calling himself alice, has his own quota, untouched by hers
                for seed in (4, 5):
                    pending.append((asyncio.create_task(post(BOB, seed, user="alice")), seed))
                await until(lambda s: s["queued_sentences"] == 4 * REQUEST, "bob's requests queueing beside hers")
                refused = await post(BOB, 9, user="someone-else")
                assert refused.status_code == 429, refused.text

                # and the single key's principal, "default", naming either of them, has its own quota too
                pending.append((asyncio.create_task(post(OPS, 6, user="alice")), 6))
                await until(lambda s: s["queued_sentences"] == 5 * REQUEST, "default's request queueing")
            finally:
                os.kill(worker, signal.SIGCONT)
            for task, seed in pending:
                reply = await task
                assert reply.status_code == 200, reply.text
                got = np.array([row["embedding"] for row in reply.json()["data"]])
                np.testing.assert_allclose(got, expected(sentences(REQUEST, seed=seed)), atol=1e-5)

    asyncio.run(attack())
    after = principal_counts(front)

    def delta(principal: str, status: str) -> float:
        return after.get((principal, status), 0.0) - before.get((principal, status), 0.0)

    assert delta("alice", "429") == 4 and delta("alice", "200") == 4
    assert delta("bob", "429") == 1 and delta("bob", "200") == 2
    assert {principal for principal, _ in after} <= {"alice", "bob", "default"}  # never a user field


@pytest.mark.timeout(60)
def test_keys_never_show_in_argv_logs_status_or_metrics(front: Front) -> None:
    guess = "guessed-key-0000000000"
    with httpx.Client(base_url=front.url, timeout=30) as http:
        assert http.post("/v1/embeddings", json={"input": "x"}, headers=_headers(guess)).status_code == 401
        assert http.post("/v1/embeddings", json={"input": "x"}, headers=_headers(BOB)).status_code == 200
        status = http.get("/status", headers=_headers(ALICE)).text
        metrics = http.get("/metrics", headers=_headers(ALICE)).text
        models = http.get("/v1/models", headers=_headers(ALICE)).text
    from bertserve.client import BertClient

    with BertClient(**front.running.client_kwargs, timeout=30_000) as bc:
        config = bc.server_config
    assert config["api_keys"] == "(set)" and config["api_key"] == "(set)"
    family = front.running.family()
    assert len(family) >= 4  # the server, its sink, worker and HTTP process
    argv = [" ".join(process.cmdline()) for process in family]
    output = front.running.tail(len(front.running.output))
    assert '"POST /v1/embeddings HTTP/1.1" 401' in output  # -v: the access log, which names no key
    for key in (ALICE, BOB, OPS, guess):
        for where, text in (
            ("argv", "\n".join(argv)),
            ("the log", output),
            ("/status", status),
            ("/metrics", metrics),
            ("/v1/models", models),
            ("CONFIG", repr(config)),
        ):
            assert key not in text, f"a key is in {where}"


@pytest.mark.timeout(60)
def test_a_malformed_key_file_stops_the_start_naming_its_line_not_its_key(tmp_path: Path) -> None:
    key_file = tmp_path / "api-keys"
    key_file.write_text(f"alice {ALICE}\n# a comment\nbob short\n")
    key_file.chmod(0o600)
    running = start_server(
        "--model-dir", str(tmp_path), "--http-port", str(free_port()), "--api-keys", str(key_file), expect_ready=False
    )  # the keys are read before the model is looked at
    try:
        assert running.process.wait(30) == 2
    finally:
        running.terminate()
        running.wait_stopped()
    output = running.tail(50)
    assert f"{key_file}, line 3: the key is shorter than 8 characters" in output, output
    assert ALICE not in output and "short" not in output.replace("shorter", "")
