"""A served model's HTTP, gRPC and ZeroMQ ends, for the tests of one shared server: ``httpx``
and the ``openai`` package with the test's API key, a gRPC channel and the call metadata that
carries the key, and a ``BertClient`` of one of its models."""

from __future__ import annotations

import functools

import grpc
import httpx
import openai
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer


class Served:
    def __init__(self, running: RunningServer, http_port: int, key: str, grpc_port: int | None = None) -> None:
        self.running = running
        self.url = f"http://127.0.0.1:{http_port}"
        self.key = key
        self.grpc_port = grpc_port

    @functools.cached_property
    def channel(self) -> grpc.Channel:
        """One channel to the gRPC port, closed with the server (:meth:`stop`)."""
        assert self.grpc_port is not None, "the server was started without --grpc-port"
        return grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")

    def metadata(self, model: str | None = None) -> list[tuple[str, str]]:
        """A gRPC call's metadata: the key, and the model it is for (else the default of its task)."""
        return [("authorization", f"Bearer {self.key}")] + ([("bertserve-model", model)] if model else [])

    def stop(self) -> None:
        if "channel" in self.__dict__:
            self.channel.close()
        self.running.stop()

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=120)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.key, max_retries=0)

    def client(self, model: str | None = None) -> BertClient:
        return BertClient(port=self.running.port, port_out=self.running.port_out, model=model, timeout=120_000)
