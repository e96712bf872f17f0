"""A head serving two models, in this process: the test plays the clients, the workers and the sink.

Each model has its own queue and workers: requests go to the model they name (else the
default), jobs never mix models, a flood on one model never holds the other's requests back,
and CONFIG, STATUS and the worker link see each model on its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from bertserve.client import protocol as p
from bertserve.server.config.model import ModelConfig
from bertserve.server.config.server import ServerConfig
from bertserve.server.model.prompts import Prompts
from bertserve.server.serving.head.models import HeadModel, Models
from bertserve.server.serving.policy.scheduler import Scheduler
from bertserve.server.serving.protocol import wire
from bertserve.server.testing.config import server_config
from rigs import Rig, ventilator_rig


def config_of(name: str, **options) -> ServerConfig:
    defaults = {
        "max_batch_size": 4,
        "max_latency_ms": 0,
        "max_request_size": 40,
        "max_client_queued_sentences": 40,
        "max_queued_sentences": 80,
    }
    model = ModelConfig.of(model_dir=f"/models/{name}")
    return server_config(model=model, served_model_name=name, **{**defaults, **options})


@pytest.fixture
def rig(tmp_path) -> Iterator[Rig]:
    fast, big = config_of("fast"), config_of("big", model_version="3")
    models = Models(
        [
            HeadModel(
                "fast",
                fast,
                Scheduler(fast.batching, fast.limits),
                Prompts({"query": "query: "}, None),
                sha256="aa" * 32,
            ),
            HeadModel("big", big, Scheduler(big.batching, big.limits, job_prefix="m1."), sha256="bb" * 32, version=3),
        ]
    )
    with ventilator_rig(tmp_path, fast, models=models) as rig:
        yield rig


def answers(rig: Rig) -> list[dict]:
    """The headers of the replies published to clients since the last call."""
    return [p.loads(m[5]) for m in rig.sink_messages() if m[0] == wire.PUBLISH]


def test_requests_go_to_the_workers_of_the_model_they_name_and_jobs_never_mix_models(rig: Rig) -> None:
    fast, _ = rig.worker(b"w-fast", 0, credits=4, model="fast")
    big, _ = rig.worker(b"w-big", 1, credits=4, model="big", version=3)
    assert {w.model for w in rig.ventilator.registry.workers.values()} == {"fast", "big"}
    rig.request(b"c1", 1, ["to the default"])
    rig.request(b"c2", 1, ["to big", "twice"], model="big")
    rig.request(b"c3", 1, ["to fast"], model="fast")
    fast_jobs = [rig.job(fast)]
    while fast.poll(200):
        _, job_id, header, payload = fast.recv_multipart()
        fast_jobs.append((job_id.decode(), p.loads(header), p.loads(payload)))
    assert sorted(text for _, _, texts in fast_jobs for text in texts) == ["to fast", "to the default"]
    job_id, header, texts = rig.job(big)
    assert texts == ["to big", "twice"] and [part["key"][:4] for part in header["parts"]] == [b"c2".hex()]
    assert job_id.startswith("m1.") and not any(job_id.startswith("m1.") for job_id, _, _ in fast_jobs)
    assert not big.poll(100)
    registers = [p.loads(m[1]) for m in rig.sink_messages() if m[0] == wire.REGISTER]
    assert {r["model"]: r["version"] for r in registers} == {"fast": None, "big": 3}


def test_a_model_this_server_does_not_serve_is_refused_with_the_names_it_serves(rig: Rig) -> None:
    rig.request(b"c", 7, ["x"], model="nope")
    rig.request(b"c", 8, ["x"], model=["not", "a", "name"])
    messages = [m for m in rig.sink_messages() if m[0] == wire.PUBLISH]
    headers = [p.loads(m[5]) for m in messages]
    assert [h["kind"] for h in headers] == [p.UNKNOWN_MODEL] * 2
    assert headers[0]["error"] == "this server serves no model 'nope'; it serves 'fast', 'big'"
    assert rig.ventilator.scheduler.empty and not rig.ventilator.requests


def test_a_flood_on_one_model_never_holds_the_other_models_requests_back(rig: Rig) -> None:
    fast, _ = rig.worker(b"w-fast", 0, credits=1, model="fast")
    rig.worker(b"w-big", 1, credits=1, model="big", version=3)
    for i in range(8):
        rig.request(b"flood", i, [f"bulk {i}.{j}" for j in range(4)], model="big")  # 32 queued for big's one worker
    rig.request(b"one", 1, ["quick"], model="fast")
    _, _, texts = rig.job(fast)
    assert texts == ["quick"]
    stats = rig.ventilator.status()
    assert stats["models"]["big"]["queued_sentences"] == 28 and stats["models"]["fast"]["queued_sentences"] == 0
    assert stats["queued_sentences"] == 28


def test_config_describes_the_model_asked_for_and_lists_every_model(rig: Rig) -> None:
    rig.worker(b"w-fast", 0, model="fast")
    answer = rig.ventilator.describe()
    assert (
        answer["model_name"] == "fast"
        and answer["default_model"] == "fast"
        and answer["prompts"] == {"query": "query: "}
    )
    assert [m["name"] for m in answer["models"]] == ["fast", "big"]
    assert [m["ready"] for m in answer["models"]] == [True, False] and not rig.ventilator.ready
    big = rig.ventilator.describe(rig.ventilator.models.by_name["big"])
    assert big["model_name"] == "big" and big["model_version"] == "3" and big["prompts"] == {}
    rig.client.send_multipart(p.encode_request(b"c", p.CONFIG, 1, {"model": "big"}, []))
    rig.pump()
    (header,) = answers(rig)
    assert header["model_name"] == "big" and header["model_dir"] == "/models/big"


def test_status_has_each_models_workers_queue_and_version(rig: Rig) -> None:
    rig.worker(b"w-fast", 0, model="fast")
    rig.worker(b"w-big", 1, model="big", version=3)
    status = rig.ventilator.status()
    assert status["ready"] and set(status["models"]) == {"fast", "big"}
    assert status["models"]["fast"]["default"] and not status["models"]["big"]["default"]
    assert status["models"]["big"]["model_version"] == 3 and status["models"]["big"]["worker_versions"] == [3]
    assert [w["model"] for w in status["workers"]] == ["fast", "big"]


def test_a_worker_of_a_model_the_head_does_not_serve_is_not_registered(rig: Rig) -> None:
    with pytest.raises(AssertionError, match="never registered"):
        rig.worker(b"w-other", 0, model="other")
    assert not rig.ventilator.registry.workers


def test_a_lost_workers_jobs_go_back_to_its_own_models_queue(rig: Rig) -> None:
    big, _ = rig.worker(b"w-big", 1, model="big", version=3)
    rig.request(b"c", 1, ["a", "b"], model="big")
    rig.job(big)
    rig.ventilator.requests.worker_lost(b"w-big", "test")
    assert rig.ventilator.models.by_name["big"].scheduler.queued == 2
    assert rig.ventilator.models.by_name["fast"].scheduler.queued == 0
    again, _ = rig.worker(b"w-big-2", 2, model="big", version=3)
    _, _, texts = rig.job(again)
    assert texts == ["a", "b"]


def test_a_swap_of_one_model_pins_only_its_own_new_requests(rig: Rig) -> None:
    big = rig.ventilator.models.by_name["big"]
    rig.ventilator.pool(big).serve_version(4, big.config.model.model_dir)
    assert rig.ventilator.models.by_name["big"].version == 4 and rig.ventilator.models.default.version is None
    rig.request(b"c", 1, ["x"], model="big")
    rig.request(b"d", 1, ["y"])
    registers = [p.loads(m[1]) for m in rig.sink_messages() if m[0] == wire.REGISTER]
    assert [(r["model"], r["version"]) for r in registers] == [("big", 4), ("fast", None)]
