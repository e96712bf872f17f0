"""A served model's HTTP and ZeroMQ ends, for the tests of one shared server: ``httpx`` and
the ``openai`` package with the test's API key, and a ``BertClient`` of one of its models."""

from __future__ import annotations

import httpx
import openai
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer


class Served:
    def __init__(self, running: RunningServer, http_port: int, key: str) -> None:
        self.running = running
        self.url = f"http://127.0.0.1:{http_port}"
        self.key = key

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=120)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.key, max_retries=0)

    def client(self, model: str | None = None) -> BertClient:
        return BertClient(port=self.running.port, port_out=self.running.port_out, model=model, timeout=120_000)
