"""A real ventilator in this process, on ipc sockets: the test plays the client, the workers
and the sink (``tests/unit/server/serving/head/test_ventilator.py``, and the worker link's tests)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from bertserve.client import protocol as p
from bertserve.server.config.server import ServerConfig
from bertserve.server.serving.head.models import Models
from bertserve.server.serving.head.ventilator import Ventilator
from bertserve.server.serving.policy.scheduler import Scheduler
from bertserve.server.serving.protocol import wire
from bertserve.server.serving.protocol.wire import Addresses


@dataclass
class Rig:
    ventilator: Ventilator
    context: zmq.Context
    client: zmq.Socket
    sink: zmq.Socket
    addresses: Addresses
    sockets: list[zmq.Socket] = field(default_factory=list)

    def request(self, client_id: bytes, request_id: int, texts: list[str], **header: Any) -> None:
        self.client.send_multipart(p.encode_request(client_id, p.ENCODE, request_id, header, texts))
        self.pump()

    def pump(self, rounds: int = 5) -> None:
        for _ in range(rounds):
            self.ventilator.poll_once(10)

    def worker(
        self, name: bytes, index: int, credits: int = 1, version: int | None = None, model: str | None = None
    ) -> tuple[zmq.Socket, zmq.Socket]:
        dealer = self.context.socket(zmq.DEALER)
        dealer.identity = name
        dealer.connect(self.addresses.jobs)
        push = self.context.socket(zmq.PUSH)
        push.connect(self.addresses.credits)
        self.sockets += [dealer, push]
        ready = {"worker": index, "pid": 100 + index, "credits": credits, "version": version, "model_name": model}
        dealer.send_multipart([wire.READY, p.dumps(ready)])
        for _ in range(50):
            self.pump(1)
            if name in self.ventilator.registry.workers:
                return dealer, push
        raise AssertionError("the worker never registered")

    def job(self, dealer: zmq.Socket) -> tuple[str, dict, list[str]]:
        self.pump()
        assert dealer.poll(2000), "no job came"
        kind, job_id, header, payload = dealer.recv_multipart()
        assert kind == wire.JOB
        return job_id.decode(), p.loads(header), p.loads(payload)

    def sink_messages(self) -> list[list[bytes]]:
        self.pump()
        messages = []
        while self.sink.poll(50):
            messages.append(self.sink.recv_multipart())
        return messages


@contextmanager
def ventilator_rig(
    tmp_path: Path, config: ServerConfig, rig_class: type[Rig] = Rig, models: Models | None = None, **options: Any
) -> Iterator[Any]:
    """A ``rig_class`` around a ventilator of ``config`` serving ``models`` (default: one, of
    ``config``; ``options`` go to the ventilator), closed with everything it made."""
    context = zmq.Context()
    addresses = Addresses(f"ipc://{tmp_path}/jobs", f"ipc://{tmp_path}/credits", f"ipc://{tmp_path}/sink")
    frontend, sink, client = context.socket(zmq.PULL), context.socket(zmq.PULL), context.socket(zmq.PUSH)
    frontend.bind(f"ipc://{tmp_path}/requests")
    sink.bind(addresses.sink)
    client.connect(f"ipc://{tmp_path}/requests")
    served = models or Scheduler(config.batching, config.limits)
    ventilator = Ventilator(config, context, frontend, addresses, served, **options)
    rig = rig_class(ventilator, context, client, sink, addresses)
    try:
        yield rig
    finally:
        ventilator.close()
        for socket in (frontend, sink, client, *rig.sockets):
            socket.close(linger=0)
        context.term()
