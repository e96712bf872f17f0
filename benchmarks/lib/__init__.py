"""The benchmarks' library: what the scripts in ``benchmarks/`` share.

- ``inputs``: the corpus, the model directory, the options every model benchmark takes;
- ``stats``: percentiles, medians, ratios and cosines, one helper each;
- ``rss``: the one sampler of a server family's resident memory;
- ``load``: calls that take turns, ``timed`` and ``wait_until``;
- ``contenders``: the in-process contenders, bertserve's ``Encoder`` and sentence-transformers;
- ``report``: progress lines, the run's environment (the CPU and its flags among it), and
  writing reports and plots;
- ``instant_model``: a model that costs nothing, for a server's worker processes
  (``--model-class lib.instant_model:InstantModel`` with ``benchmarks/`` on ``PYTHONPATH``);
- ``bge_m3_shape``: random weights of BGE-M3's shape in FlagEmbedding's layout, made once
  into a cache folder (with PyTorch and transformers, imported only then);
- ``reference_stack``: the tiny families and helpers of the scripts that make the tests'
  reference models with transformers and sentence-transformers (it imports PyTorch: only
  ``make_family_references.py`` and ``make_task_references.py`` import it).

Servers are started by the one launcher the tests use, ``bertserve.server.testing.launcher``.
The scripts run as ``python benchmarks/NAME.py``, so ``benchmarks/`` is on ``sys.path`` and
this package imports as ``lib``, beside the packages of the scripts' own parts
(``comparing``, ``soaking``, ``cohosting``, ``swapping``, ``sharing``). Nothing here imports
TensorFlow or PyTorch until an in-process contender is built.
"""
