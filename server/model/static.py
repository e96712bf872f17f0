"""Static embeddings (model2vec): each token has a row of a table, and a text's vector is the
mean of its tokens' rows. No network runs, so no TensorFlow: numpy, ``tokenizers`` and
``safetensors`` serve it, in the worker and in the head alike.

A directory is served this way when its ``config.json`` says ``"model_type": "model2vec"``, or
its ``modules.json`` names one ``StaticEmbedding`` module in the directory itself: the layout
``model2vec.StaticModel.save_pretrained`` writes (``model.safetensors`` with the table
``embeddings`` and, after vocabulary quantization, a ``weights`` per token and a ``mapping``
of token to row; ``tokenizer.json``; ``config.json`` with ``normalize`` and ``max_length``).

The vectors are those of model2vec 0.10's ``StaticModel.encode``: a text is first cut to
``max_length`` times the median length of the vocabulary's tokens in characters, then
tokenized without special tokens and cut to ``max_length`` tokens; the unknown token is
dropped; the mean of the rows (each times its token's weight, where the model has weights);
a text with no token left is a vector of zeros. Unit length when the model (or the request)
normalizes: the worker leaves that to the sink, as it does for BERT models.

Options for TensorFlow's graph (``pooling_strategy``, ``pooling_layer``, ``mask_cls_sep``,
``dtype`` other than ``auto``/``fp32``, ``xla``, ``tuned_model_dir``, ``vocab_name``,
``do_lower_case``, ``calibration``, ``instruction``, ``task`` other than embed and
``long_inputs=chunk``) are refused with the reason; ``graph_dir``, ``lite_max_tokens`` and
``device`` say where a graph runs, and are ignored.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from bertserve.client.protocol import check_texts

from ..config.model import DYNAMIC, ModelConfig
from ..errors import ModelError, ModelFileError
from .chunking import unit_rows
from .json_file import read_json
from .tokenization import ModelTokenizer, TokenizedBatch
from .tokenizer_files import unk_id

MODEL_TYPE = "model2vec"
STATIC_MODULE = "sentence_transformers.models.StaticEmbedding"
DEFAULT_MAX_LENGTH = 512  # model2vec's, for a config that names none
# Inputs whose token rows are gathered at once: a few MB, kept in cache (all 10,000 of a bulk job
# at once gathered 250 MB, and ran 3x slower than model2vec's buckets)
_ROWS_AT_ONCE = 128
_TABLE_DTYPES = ("float64", "float32", "float16", "int8")  # what safetensors gives numpy, and model2vec writes


def is_static_model(model_dir: str) -> bool:
    """Whether ``model_dir`` holds a static model in model2vec's layout (nothing is checked
    beyond what says so: :func:`read_static` checks the files)."""
    config = os.path.join(model_dir, "config.json")
    try:
        if os.path.isfile(config) and read_json(config).get("model_type") == MODEL_TYPE:
            return True
        modules = os.path.join(model_dir, "modules.json")
        if not os.path.isfile(modules):
            return False
        import json

        with open(modules, encoding="utf-8") as f:
            listed = json.load(f)
    except (ModelFileError, OSError, ValueError):
        return False
    first = listed[0] if isinstance(listed, list) and listed else None
    return isinstance(first, dict) and first.get("type") == STATIC_MODULE and first.get("path") in (".", "", "./")


@dataclass(frozen=True)
class StaticFiles:
    """A checked static model directory: its files and what its config and table say."""

    model_dir: str
    table_path: str
    tokenizer_json: str
    normalize: bool
    max_length: int | None  # tokens; None: the model cuts nothing
    rows: int
    dim: int
    dtype: str  # the table's
    weighted: bool  # a weight per token (vocabulary quantization)
    mapped: bool  # a row per token given by ``mapping``


def read_static(model_dir: str) -> StaticFiles:
    """Check the files of the static model in ``model_dir`` (its table's header, not its rows)."""
    from safetensors import safe_open

    paths = [os.path.join(model_dir, name) for name in ("config.json", "model.safetensors", "tokenizer.json")]
    for path in paths:
        if not os.path.isfile(path):
            raise ModelFileError(
                f"missing file {path}: a static (model2vec) model has config.json, model.safetensors and tokenizer.json"
            )
    config = read_json(paths[0])
    normalize, max_length = config.get("normalize", False), config.get("max_length", DEFAULT_MAX_LENGTH)
    if not isinstance(normalize, bool):
        raise ModelFileError(f"{paths[0]}: normalize must be true or false, not {normalize!r}")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise ModelFileError(f"{paths[0]}: max_length must be a number of tokens or null, not {max_length!r}")
    if config.get("head_config") is not None:
        raise ModelFileError(
            f"{paths[0]} has a head_config (a model2vec classifier): bertserve serves its vectors "
            "only; serve the embedding model it was trained from"
        )
    try:
        with safe_open(paths[1], framework="numpy") as tensors:
            names = set(tensors.keys())
            shapes = {name: tuple(tensors.get_slice(name).get_shape()) for name in names}
            dtypes = {name: str(tensors.get_slice(name).get_dtype()) for name in names}
    except Exception as exc:  # safetensors raises its own errors, which it does not export
        raise ModelFileError(f"cannot read {paths[1]}: {exc}") from exc
    if "embeddings" not in names or len(shapes["embeddings"]) != 2:
        raise ModelFileError(f"{paths[1]} has no 2-D tensor 'embeddings' (tokens x dimensions), which model2vec writes")
    dtype = {"F64": "float64", "F32": "float32", "F16": "float16", "I8": "int8"}.get(dtypes["embeddings"])
    if dtype not in _TABLE_DTYPES:
        raise ModelFileError(
            f"{paths[1]}: the table's dtype {dtypes['embeddings']} is not one numpy reads "
            "(float64, float32, float16, int8)"
        )
    rows, dim = shapes["embeddings"]
    for name in ("weights", "mapping"):
        if name in names and len(shapes[name]) != 1:
            raise ModelFileError(f"{paths[1]}: '{name}' should hold one value a token, not a {shapes[name]} tensor")
    return StaticFiles(
        model_dir, paths[1], paths[2], normalize, max_length, rows, dim, dtype, "weights" in names, "mapping" in names
    )


def static_options(requested: ModelConfig, files: StaticFiles) -> ModelConfig:
    """``requested`` with what it leaves out taken from the model; an option that has no
    meaning for a table of vectors is refused, with why."""
    graph_only = {
        "pooling_strategy": requested.pooling_strategy is not None,
        "pooling_layer": requested.pooling_layer is not None,
        "mask_cls_sep": requested.mask_cls_sep,
        "xla": requested.xla,
        "tuned_model_dir": requested.tuned_model_dir is not None,
        "vocab_name": requested.vocab_name is not None,
        "do_lower_case": requested.do_lower_case is not None,
        "calibration": requested.calibration is not None,
        "instruction": requested.instruction is not None,
        f"dtype {requested.dtype}": requested.dtype not in ("auto", "fp32"),
        f"task {requested.task}": requested.task not in (None, "embed"),
        "long_inputs=chunk": requested.long_inputs == "chunk",
    }
    refused = [name for name, given in graph_only.items() if given]
    if refused:
        raise ModelError(
            f"{refused[0]} does not apply to a static model (model2vec): a text's vector is the mean "
            "of its tokens' rows of a table, with no network, layers or graph"
        )
    if requested.max_seq_len == DYNAMIC:
        raise ModelError("max_seq_len NONE does not apply to a static model: it cuts a text at a number of tokens")
    max_len = requested.max_seq_len if requested.max_seq_len is not None else files.max_length
    if max_len is None:
        raise ModelError(
            f"{files.model_dir}'s config sets no max_length (model2vec then cuts nothing): serve it "
            "with a bound, --max-seq-len N"
        )
    normalize = files.normalize if requested.normalize is None else requested.normalize
    return requested.replace(max_seq_len=int(max_len), normalize=normalize, task="embed")


def describe_static(config: ModelConfig, files: StaticFiles) -> dict[str, Any]:
    """What the head, clients and ``bertserve status`` are told of the model."""
    return {
        "model_dir": config.model_dir,
        "family": "static",
        "task": "embed",
        "runtime": "numpy",
        "output_dim": files.dim,
        "output_dtype": config.output_dtype,
        "token_level": False,
        "chunking": False,
        "long_inputs": "truncate",
        "max_seq_len": config.max_seq_len,
        "normalize": bool(config.normalize),
        "dtype": files.dtype,
        "pads": False,  # a run reads each input's own tokens: the head need not sort bulk work by length
    }


def head_tokenizer(files: StaticFiles, config: ModelConfig) -> ModelTokenizer:
    """The tokenizer the head and the HTTP process count tokens with: the model's, adding no
    special tokens, cut at ``max_seq_len`` tokens (before the unknown token is dropped)."""
    normalizer = read_json(files.tokenizer_json).get("normalizer")
    lowercase = normalizer.get("lowercase", True) if isinstance(normalizer, dict) else True
    assert isinstance(config.max_seq_len, int)
    return ModelTokenizer(
        vocab_path=None,
        tokenizer_json=files.tokenizer_json,
        do_lower_case=bool(lowercase),
        max_len=config.max_seq_len,
        add_special_tokens=False,
    )


def resolve_static(requested: ModelConfig) -> tuple[dict[str, Any], ModelTokenizer]:
    """:func:`.options.resolve_options` for a static model: its description and tokenizer."""
    files = read_static(requested.model_dir)
    config = static_options(requested, files)
    return describe_static(config, files), head_tokenizer(files, config)


class StaticEncoder:
    """A static model behind the :class:`~.interface.Model` protocol, and ``encode`` in this
    process as :class:`~.encoder.Encoder` has it."""

    def __init__(self, model_dir: str | os.PathLike[str] | ModelConfig, **options: Any) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        if isinstance(model_dir, ModelConfig):
            requested = model_dir.replace(**options) if options else model_dir
        else:
            requested = ModelConfig.of(model_dir=os.fspath(model_dir), **options)
        self.files = files = read_static(requested.model_dir)
        self.config = static_options(requested, files)
        tensors = load_file(files.table_path)
        table = tensors["embeddings"]
        self._table = table if table.dtype == np.float32 else table.astype(np.float32)
        self._weights = tensors["weights"].astype(np.float32) if files.weighted else None
        self._mapping = tensors["mapping"].astype(np.int64) if files.mapped else None
        try:
            tokenizer = Tokenizer.from_file(files.tokenizer_json)
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise ModelFileError(f"cannot read {files.tokenizer_json}: {exc}") from exc
        vocab = tokenizer.get_vocab()
        rows_needed = len(vocab) if self._mapping is None else int(self._mapping.max(initial=-1)) + 1
        if len(table) < rows_needed or (self._mapping is None and len(table) != len(vocab)):
            raise ModelFileError(
                f"{files.table_path} has {len(table)} rows for the {len(vocab)} tokens of "
                f"{files.tokenizer_json}: they do not belong together"
            )
        if self._weights is not None and len(self._weights) < len(vocab):
            raise ModelFileError(f"{files.table_path} has {len(self._weights)} weights for {len(vocab)} tokens")
        tokenizer.no_padding()
        self.max_len: int = int(self.config.max_seq_len)  # type: ignore[arg-type]
        tokenizer.enable_truncation(self.max_len)
        self._tokenizers = {"right": tokenizer}
        self._unk = unk_id(tokenizer)
        # model2vec first cuts a text to max_length times its tokens' median length in characters
        self._chars = self.max_len * int(np.median([len(token) for token in vocab]))
        self.output_dim: int = files.dim
        self.output_dtype = np.dtype(self.config.output_dtype)
        self.token_level = False

    def describe(self) -> dict[str, Any]:
        return describe_static(self.config, self.files)

    def encode(self, texts: Sequence[str], normalize: bool | None = None) -> np.ndarray:
        """One vector per text, as ``StaticModel.encode`` gives it (in ``output_dtype``)."""
        vectors = self.run(self.tokenize(check_texts(texts, False)))
        return unit_rows(vectors) if (self.config.normalize if normalize is None else normalize) else vectors

    def tokenize(
        self,
        texts: Sequence[Any],
        *,
        is_tokenized: bool = False,
        keep_tokens: bool = False,
        chunk: bool = False,
        truncation_direction: str = "right",
    ) -> TokenizedBatch:
        if chunk:
            raise ValueError("a static model encodes no long input in windows: long_inputs=chunk is not available")
        if truncation_direction not in ("right", "left"):
            raise ValueError(f"truncation_direction must be 'right' or 'left', not {truncation_direction!r}")
        left = truncation_direction == "left"
        if is_tokenized:
            ids, cut = self._token_ids(texts, left)
        else:
            ids, cut = self._text_ids([str(text) for text in texts], left)
        input_ids, lengths = self._pack(ids)
        tokenizer = self._tokenizers["right"]
        tokens = None
        if keep_tokens:
            rows = zip(input_ids.tolist(), lengths.tolist(), strict=True)
            tokens = [[str(tokenizer.id_to_token(i)) for i in row[:n]] for row, n in rows]
        return TokenizedBatch(input_ids, np.zeros_like(input_ids), lengths, np.asarray(cut, bool), tokens)

    def _pack(self, ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """``ids`` as rows of a zero-padded matrix and their lengths, without the unknown token
        (as model2vec drops it: word-level vocabularies leave many), in numpy, not per token."""
        lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(lengths.sum()))
        if self._unk is not None:
            known = flat != self._unk
            if not known.all():
                owner = np.repeat(np.arange(len(ids)), lengths)
                flat, lengths = flat[known], np.bincount(owner[known], minlength=len(ids))
        input_ids = np.zeros((len(ids), max(int(lengths.max(initial=0)), 1)), np.int32)
        input_ids[np.arange(input_ids.shape[1])[None, :] < lengths[:, None]] = flat  # row by row, in order
        return input_ids, lengths.astype(np.int32)

    def _text_ids(self, texts: list[str], left: bool) -> tuple[list[list[int]], list[bool]]:
        chars = self._chars
        kept = [text[-chars:] if left else text[:chars] for text in texts] if chars else texts
        encodings = self._tokenizer(left).encode_batch_fast(kept, add_special_tokens=False)
        cut = [len(text) > chars or bool(enc.overflowing) for text, enc in zip(texts, encodings, strict=True)]
        return [enc.ids for enc in encodings], cut

    def _token_ids(self, texts: Sequence[Any], left: bool) -> tuple[list[list[int]], list[bool]]:
        """Pre-tokenized input: each vocabulary token as it is, other words tokenized."""
        tokenizer = self._tokenizers["right"]
        rows = []
        for tokens in texts:
            row: list[int] = []
            for token in tokens:
                found = tokenizer.token_to_id(str(token))
                row.extend([found] if found is not None else tokenizer.encode(str(token), add_special_tokens=False).ids)
            rows.append(row)
        cut = [len(row) > self.max_len for row in rows]
        return [row[-self.max_len :] if left else row[: self.max_len] for row in rows], cut

    def _tokenizer(self, left: bool):  # -> tokenizers.Tokenizer
        side = "left" if left else "right"
        if side not in self._tokenizers:
            from tokenizers import Tokenizer

            twin = Tokenizer.from_str(self._tokenizers["right"].to_str())
            twin.no_padding()
            twin.enable_truncation(self.max_len, direction="left")
            self._tokenizers[side] = twin
        return self._tokenizers[side]

    def run(self, batch: TokenizedBatch) -> np.ndarray:
        """The mean of each input's rows (zeros for an input with no token), not normalized."""
        out = np.zeros((len(batch.lengths), self.output_dim), np.float32)
        for start in range(0, len(out), _ROWS_AT_ONCE):
            part = slice(start, start + _ROWS_AT_ONCE)
            self._mean_rows(batch.input_ids[part], batch.lengths[part].astype(np.int64), out[part])
        return out if self.output_dtype == np.float32 else out.astype(self.output_dtype)

    def _mean_rows(self, input_ids: np.ndarray, lengths: np.ndarray, out: np.ndarray) -> None:
        filled = lengths > 0
        if not filled.any():
            return
        ids = input_ids[np.arange(input_ids.shape[1])[None, :] < lengths[:, None]]  # the tokens, one after another
        rows = self._table[ids if self._mapping is None else self._mapping[ids]]
        if self._weights is not None:
            rows *= self._weights[ids][:, None]
        starts = (np.cumsum(lengths) - lengths)[filled]
        out[filled] = np.add.reduceat(rows, starts, axis=0) / lengths[filled, None]

    def token_slots(self, batch: TokenizedBatch) -> int:
        return int(batch.lengths.sum())  # no padding: each input's own tokens are read

    def plan(self, batch: TokenizedBatch) -> list[np.ndarray]:
        # One run: a job of thousands of texts takes milliseconds, less than a short job would
        # wait for a turn between two runs.
        return [np.arange(len(batch))]


__all__ = ["StaticEncoder", "is_static_model", "read_static", "resolve_static"]
