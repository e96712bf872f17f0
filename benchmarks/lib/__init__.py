"""The benchmarks' library: what every scenario script in ``benchmarks/`` shares.

- ``inputs``: the corpus, the model directory, the options every model benchmark takes;
- ``stats``: percentiles, medians, ratios and cosines, one helper each;
- ``rss``: the one sampler of a server family's resident memory;
- ``servers``: the launcher of real servers (``bertserve.server.testing.launcher``, which the tests use
  too) and what the suite builds on it:
  server options, a server process with its counters and RSS, a pool that stops them all;
- ``load``: clients in threads, and calls that take turns;
- ``contenders``: the in-process contenders, bertserve's ``Encoder`` and sentence-transformers;
- ``report``: progress lines, the run's environment, and writing reports and plots.

The scripts run as ``python benchmarks/NAME.py``, so ``benchmarks/`` is on ``sys.path`` and
this package imports as ``lib``. Nothing here imports TensorFlow or PyTorch until an
in-process contender is built.
"""
