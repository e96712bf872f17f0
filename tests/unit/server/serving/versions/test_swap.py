"""The version swap carrying out its plan (:mod:`bertserve.server.serving.versions.swap`) against a fake
ventilator and supervisor: what it asks of each, and what the status shows."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from bertserve.server.config.model import ModelConfig
from bertserve.server.config.server import ServerConfig
from bertserve.server.serving.versions.book import VersionsBook
from bertserve.server.serving.versions.plan import Release
from bertserve.server.serving.versions.swap import VersionSwap
from bertserve.server.testing.config import server_config


@dataclasses.dataclass
class FakeWorker:
    version: int | None
    ready: bool = True
    alive: bool = True
    draining: bool = False
    jobs: bool = False
    retiring: bool = False


class FakeHead:
    """The ventilator (interfaces.WorkerPool) and the supervisor (interfaces.WorkerProcesses)
    as the swap sees them."""

    def __init__(self, versions: list[int], serving: int) -> None:
        self.workers = {index: FakeWorker(version) for index, version in enumerate(versions)}
        self.serving = serving
        self.stopped: list[int] = []

    @property
    def serving_version(self) -> int | None:
        return self.serving

    def serve_version(self, version: int | None, model_dir: str) -> None:
        self.serving = version or 0

    def queued_versions(self) -> set[int | None]:
        return set()

    def worker_ready(self, index: int) -> bool:
        return self.workers[index].ready

    def worker_draining(self, index: int) -> bool:
        return self.workers[index].draining

    def worker_holds_jobs(self, index: int) -> bool:
        return self.workers[index].jobs

    def drain_worker(self, index: int) -> None:
        self.workers[index].draining = True

    def stop_worker(self, index: int) -> None:
        self.stopped.append(index)

    def take_reload(self) -> tuple[str, int] | None:
        return None

    def worker_versions(self) -> dict[int, int | None]:
        return {index: worker.version for index, worker in self.workers.items()}

    def worker_alive(self, index: int) -> bool:
        return self.workers[index].alive

    def retiring_workers(self) -> set[int]:
        return {index for index, worker in self.workers.items() if worker.retiring}

    def add_worker(self, release: Release) -> int:
        index = max(self.workers, default=-1) + 1
        self.workers[index] = FakeWorker(release.version, ready=False)
        return index

    def retire_worker(self, index: int) -> None:
        self.workers[index].retiring = True

    def kill_worker(self, index: int) -> None:
        self.workers[index].alive = False

    def prepare(self, config: ServerConfig, steps: list[str]) -> None:
        return None


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    for number in (1, 2):
        (tmp_path / str(number)).mkdir()
    return tmp_path


def version(repository: Path, number: int) -> Release:
    model = ModelConfig.of(model_dir=str(repository / str(number)))
    return Release(server_config(model=model, num_worker=1, poll_interval_s=0), number)


def progress(book: VersionsBook) -> dict[str, Any]:
    return book.version_status()["swap"]


def swap_of(repository: Path, head: FakeHead, book: VersionsBook) -> VersionSwap:
    book.repository = str(repository)
    return VersionSwap(version(repository, 1), pool=head, processes=head, book=book, follow_latest=False)


def test_a_swap_replaces_the_worker_and_reports_its_progress(repository: Path) -> None:
    head, book = FakeHead([1], serving=1), VersionsBook()
    swap = swap_of(repository, head, book)
    try:
        assert book.version_status() == {"refused_versions": [], "swap": {"state": "idle", "reload": 0}}
        swap.begin(version(repository, 2), reload=3)
        status = progress(book)
        assert {k: status[k] for k in ("state", "reload", "version_from", "version_to", "workers_replaced")} == {
            "state": "rolling",
            "reload": 3,
            "version_from": 1,
            "version_to": 2,
            "workers_replaced": 0,
        }
        swap.tick(0.0)
        assert head.worker_versions() == {0: 1, 1: 2}
        assert progress(book)["message"] == "worker 1 is loading version 2"
        head.workers[1].ready = True
        swap.tick(0.25)
        assert head.serving == 2 and head.workers[0].draining
        assert progress(book)["message"] == "worker 0 of version 1 is finishing its jobs"
        swap.tick(0.5)
        assert head.workers[0].retiring and head.stopped == [0] and progress(book)["workers_replaced"] == 1
        del head.workers[0]
        swap.tick(0.75)
        status = progress(book)
        assert status["state"] == "done" and status["message"] == "serving version 2" and "finished" in status
    finally:
        swap.close()


def test_a_worker_that_cannot_load_rolls_back_and_its_version_is_refused(repository: Path) -> None:
    head, book = FakeHead([1], serving=1), VersionsBook()
    swap = swap_of(repository, head, book)
    try:
        swap.begin(version(repository, 2), reload=1)
        swap.tick(0.0)
        assert swap.keep(1, 9) is False  # not started again
        status = book.version_status()
        reason = "its worker 1 could not load it (exit code 9; see the errors above)"
        assert status["swap"]["state"] == "rolling_back"
        assert status["swap"]["message"] == f"version 2 failed: {reason}"
        assert [(e["version"], e["reason"]) for e in status["refused_versions"]] == [(2, reason)]
        del head.workers[1]
        swap.tick(0.25)
        status = book.version_status()
        assert status["swap"]["state"] == "rolled_back" and status["swap"]["message"] == "serving version 1"
        assert head.serving == 1 and head.worker_versions() == {0: 1}
        assert swap.keep(0, 1) is True  # no swap under way: the usual restarts
    finally:
        swap.close()
