"""A server started with ``--dtype int8``, end to end: what it says it runs, and the vectors
it returns. (``--dtype auto``'s ready line and config: ``test_server.py``.)"""

from __future__ import annotations

import os

import numpy as np
import pytest
from bertserve.client import BertClient
from bertserve.server import Encoder
from bertserve.server.testing.launcher import start_server
from checks import cosine_rows

pytestmark = pytest.mark.timeout(300)

TEXTS = [f"the quick brown fox {i} jumps over the lazy dog" * (1 + i % 4) for i in range(150)]


def test_an_int8_server_serves_litert_int8_vectors(tiny_google: str, tmp_path) -> None:
    graph_dir = str(tmp_path / "graphs")
    server = start_server(
        "--model-dir",
        tiny_google,
        "--graph-dir",
        graph_dir,
        "--max-seq-len",
        "32",
        "--dtype",
        "int8",
        "--num-worker",
        "1",
    )
    try:
        assert server.ready_line is not None and "int8" in server.ready_line
        # some rows are cut at 32 tokens, on purpose
        with BertClient(**server.client_kwargs, timeout=60_000, check_length=False) as client:
            config = client.server_config
            many = client.encode(TEXTS)
            one = np.concatenate([client.encode([text]) for text in TEXTS[:5]])
        assert config["dtype"] == "int8" and config["dtype_requested"] == "int8"
        key = Encoder(tiny_google, max_seq_len=32, dtype="int8", graph_dir=graph_dir).meta.key
        assert f"{key}.lite" in os.listdir(graph_dir)  # made before the worker started, by the preparation
    finally:
        server.stop()
    quantized = Encoder(tiny_google, max_seq_len=32, dtype="int8", graph_dir=graph_dir)
    np.testing.assert_allclose(many, quantized.encode(TEXTS), atol=1e-5)
    np.testing.assert_allclose(one, many[:5], atol=1e-5)
    fp32 = Encoder(tiny_google, max_seq_len=32, dtype="fp32", lite_max_tokens=0, graph_dir=graph_dir)
    assert cosine_rows(many, fp32.encode(TEXTS)).min() >= 0.99
