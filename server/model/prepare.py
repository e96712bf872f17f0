"""What a worker loads, made ahead of it in a short-lived process of its own.

A worker loads two things its model directory does not hold: the optimized graph
(:mod:`.graph`) and, where small runs go to LiteRT, that graph converted (:mod:`.lite`).
Both are cached, but making them holds several copies of the weights at once: for
all-MiniLM-L6-v2 a build peaks ~350 MiB and a conversion ~950 MiB above TensorFlow's own
footprint, and the C heap keeps much of that afterwards. A worker that made them would
carry the excess for its life, and during a version swap its peak would come on top of
every serving worker's.

So the server looks for what is missing (:func:`missing_steps`, without TensorFlow) and
makes it in a child process (:class:`Preparation`) before it starts a worker: the child
gives the heap back between a build and a conversion, exits, and the worker finds both in
the cache. An ``Encoder`` made in process still makes whatever is missing itself.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import multiprocessing
import os
import signal
from multiprocessing.process import BaseProcess

from ..config.model import ModelConfig
from ..config.telemetry import Telemetry
from .default import default_graph_dir
from .graph import GraphSpec, cache_key, load_or_build, serving_graph
from .model_dir import inspect_model
from .options import resolve
from .static import is_static_model

logger = logging.getLogger("bertserve.prepare")

STEPS = ("graph", "lite")
STEP_NAMES = {"graph": "graph", "lite": "LiteRT model"}
FAILED_EXIT_CODE = 4
BACKGROUND_NICE = 19
"""The CPU priority of a build while workers serve (a version swap, a model started after
another): the lowest, so the serving workers keep the CPU and the build takes what they leave."""


def small_run_spec(config: ModelConfig, spec: GraphSpec) -> GraphSpec | None:
    """The graph whose LiteRT form takes this model's runs on a CPU, or None: every run in
    int8 (see :mod:`.int8`); the small ones (see :mod:`.lite`) in fp32, and in the bf16 that
    ``auto`` picks, where they run in fp32 on LiteRT: LiteRT has no bf16 products, and a lone
    sentence runs faster there in fp32 than in bf16 on TensorFlow, whose per-op cost a small
    run cannot spread (fp32 is more accurate than the bf16 ``auto`` names). A bf16 the user
    asked for keeps every run in bf16."""
    if spec.dtype == "int8":
        return spec
    if not config.lite_max_tokens or config.xla:
        return None
    if spec.dtype == "fp32":
        return spec
    if spec.dtype == "bf16" and config.dtype == "auto":
        return dataclasses.replace(spec, dtype="fp32")
    return None


def missing_steps(requested: ModelConfig) -> list[str]:
    """The steps of :data:`STEPS` whose product is not in the graph cache yet. Reads and
    hashes the model files (for the cache key) but loads no TensorFlow."""
    if is_static_model(requested.model_dir):
        return []  # a table of vectors: no graph to build
    model = inspect_model(requested)
    config, spec = resolve(requested, model)
    spec = serving_graph(spec)  # the graph the workers run
    graph_dir = config.graph_dir or default_graph_dir()
    key = cache_key(model, spec)
    steps = []
    if not os.path.exists(os.path.join(graph_dir, f"{key}.graph")):
        steps.append("graph")
    lite_installed = importlib.util.find_spec("ai_edge_litert") is not None
    small = small_run_spec(config, spec)
    if small is not None and lite_installed:
        small_key = cache_key(model, small) if small != spec else key
        if not os.path.exists(os.path.join(graph_dir, f"{small_key}.lite")):
            steps.append("lite")
    return steps


def run_steps(
    requested: ModelConfig, steps: list[str], cpu_only: bool, threads: int, telemetry: Telemetry, nice: int = 0
) -> None:
    """Entry point of the preparing child (started with ``spawn``): make each of ``steps``'
    products and cache them, the heap given back between the two, at CPU priority ``nice``.
    Exits with :data:`FAILED_EXIT_CODE` when the model cannot be built."""
    from ..logs import child_telemetry, held_native_output
    from ..memory import trim_heap
    from . import lite

    child_telemetry(telemetry, "prepare")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server process decides when we stop
    if nice:
        os.nice(nice)
    with held_native_output():  # TensorFlow's libraries log as they load, and CUDA as it looks for GPUs
        import tensorflow as tf

        gpus = [] if cpu_only else tf.config.list_physical_devices("GPU")
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.set_visible_devices([], "GPU")  # the steps run on the CPU and leave the GPUs to workers
    step = ""
    try:
        model = inspect_model(requested)
        config, spec = resolve(requested, model)
        spec = serving_graph(spec)  # the graph the workers run
        graph_dir = config.graph_dir or default_graph_dir()
        key = None  # the graph's, once built here
        for step in steps:
            if step == "graph":
                key = load_or_build(model, spec, graph_dir)[1].key
                trim_heap()  # a build's copies of the weights, given back before the conversion needs its own
            elif step == "lite" and not gpus:  # GPU workers take no LiteRT path
                small = small_run_spec(config, spec)
                if small is not None:
                    lite.load_or_convert(model, small, graph_dir, key if small == spec else None)
    except Exception as exc:
        logger.error("could not build the %s of %s: %s", STEP_NAMES.get(step, step), requested.model_dir, exc)
        raise SystemExit(FAILED_EXIT_CODE) from None


class Preparation:
    """The missing steps for one model, run in a child process; :meth:`poll` returns None
    while it runs, then True, or False when it failed (:attr:`failure` says how)."""

    def __init__(
        self,
        requested: ModelConfig,
        steps: list[str],
        *,
        cpu_only: bool,
        threads: int,
        telemetry: Telemetry,
        nice: int = 0,
    ) -> None:
        self.steps = list(steps)
        self.failure = ""
        args = (requested, self.steps, cpu_only, threads, telemetry, nice)
        self.process: BaseProcess = multiprocessing.get_context("spawn").Process(
            target=run_steps, args=args, name="bertserve-prepare", daemon=True
        )
        self.process.start()

    def poll(self) -> bool | None:
        if self.process.is_alive():
            return None
        self.process.join()
        code = self.process.exitcode
        if code != 0:
            names = " and ".join(STEP_NAMES[step] for step in self.steps)
            self.failure = f"its {names} could not be built (exit code {code}; see above)"
        return code == 0

    def stop(self) -> None:
        """Kill the child if it still runs (the server is stopping)."""
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
