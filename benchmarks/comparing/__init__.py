"""The runs of ``suite.py``: its ``sweep`` and its ``compare``.

- ``sweep``: one thing varied at a time from a base configuration, a point per value;
- ``compare``: the contenders side by side, round-robin, with ``latency`` (under load),
  ``roofline`` (this machine's matmul ceiling), ``onnx_contenders`` (ONNX Runtime fp32 and
  int8), ``targets`` (each PASS or MISS) and ``report`` (markdown and plot);
- ``servers`` and ``load``: the servers both runs start (options, RSS and work counters, a
  pool that stops them all) and the clients in threads that load them.
"""
