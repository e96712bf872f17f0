"""Late-interaction models: several outputs from one model run.

Two layouts are served, each as its library computes it:

- **BGE-M3** (FlagEmbedding's ``BGEM3FlagModel``): an XLM-RoBERTa encoder with
  ``sparse_linear.pt`` (hidden -> 1) and ``colbert_linear.pt`` (hidden -> hidden) beside it.
  From one run of the last layer ``h``:

  - *dense*: ``h[CLS]``, normalized (by the sink, as for every normalizing model);
  - *sparse*: ``ReLU(sparse_linear(h))`` per token, the largest over the tokens of one id, the
    special tokens (``<s>``, ``</s>``, ``<pad>``, ``<unk>``) left out;
  - *multivector*: ``colbert_linear(h)`` on every real token but the first, normalized;
  - *rerank*: MaxSim averaged over the query's tokens (FlagEmbedding's ``colbert_score``).

- **ColBERT** in PyLate's format: an encoder, a ``Dense`` projection in ``modules.json``, and
  ``config_sentence_transformers.json``'s query and document prefixes, lengths and skiplist.
  A query is cut to ``query_length - 1`` tokens, its prefix token put after ``[CLS]``, and
  padded with ``[MASK]`` to ``query_length`` (query expansion; the ``[MASK]`` tokens attended or
  not as ``attend_to_expansion_tokens`` says), every position a vector. A document is cut to
  ``document_length - 1``, its prefix put after ``[CLS]``, and its skiplist's tokens left out of
  its vectors. Each vector is the Dense projection of the token's, normalized. A rerank sums
  MaxSim over the query's tokens (PyLate's ``colbert_scores``).

The encoder runs as any other (:class:`~.encoder.Encoder`, its graph frozen and cached; fp32,
bf16 or int8) with no pooling; the heads are small products on its last layer, in numpy.
Rows of one job are run together whatever outputs their requests ask for: the worker asks
:meth:`LateModel.run_tasks` for each output of the rows that want it.

A job's memory is bounded by its model runs: each holds at most ``batch_size`` rows of
``max_seq_len`` tokens of the encoder's hidden width, and the answer of a multi-vector job
``rows x max_seq_len x dim`` float32 (the head refuses, before any work, a request whose
answer could pass ``--max-reply-bytes``: :func:`...serving.policy.costs.token_answer_bytes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..config.model import ModelConfig, PoolingStrategy
from ..errors import ModelError
from .late_heads import named, read_heads
from .model_dir import inspect_model
from .options import build_tokenizer
from .tasks import late_kind
from .tokenization import ModelTokenizer, TokenizedBatch, split_pair

# What each position of a row is, as its segment id says (the encoder runs with none): a
# token of the text (a rerank pair's query), a query's expansion, a rerank pair's document;
# 0 is padding.
QUERY, EXPANSION, DOCUMENT = 1, 2, 3


class LateModel:
    """A BGE-M3 or ColBERT model, served: the :class:`~.interface.Model` protocol, plus
    :meth:`run_tasks`, several outputs from one run."""

    def __init__(self, config: ModelConfig) -> None:
        from .encoder import Encoder

        kind = late_kind(config.model_dir)
        if not kind:
            raise ModelError(f"{config.model_dir} is neither BGE-M3 nor a ColBERT model in PyLate's format")
        for name in ("pooling_strategy", "pooling_layer", "normalize"):
            if getattr(config, name) is not None:
                raise ModelError(f"{name} does not apply to {named(kind)}: its outputs are its own")
        if config.long_inputs == "chunk":
            raise ModelError(f"long_inputs=chunk does not apply to {named(kind)}: a long input is truncated")
        files = inspect_model(config)
        self.head = files.head
        self.heads = heads = read_heads(files, config.model_dir, kind)
        length = config.max_seq_len
        if kind == "colbert":
            length = max(heads.query_length, int(length) if isinstance(length, int) else heads.document_length)
        self.encoder = Encoder(
            config.replace(pooling_strategy=PoolingStrategy.NONE, normalize=False, max_seq_len=length)
        )
        self.config = self.encoder.config
        self.adapters: tuple[str, ...] = ()
        self._documents: ModelTokenizer | None = None
        self._queries: ModelTokenizer | None = None
        if kind == "colbert":
            document_length = int(config.max_seq_len) if isinstance(config.max_seq_len, int) else None
            document_length = min(document_length or heads.document_length, self.encoder.max_len)
            self._documents = build_tokenizer(files, config.replace(max_seq_len=document_length - 1))
            self._queries = build_tokenizer(files, config.replace(max_seq_len=heads.query_length - 1))
        self.max_len = self._documents.max_len + 1 if self._documents is not None else self.encoder.max_len

    # -- what the worker and the head are told ------------------------------------------------

    def describe(self) -> dict[str, Any]:
        out = self.encoder.describe()
        colbert = self.heads.kind == "colbert"
        out.update(
            self.head.describe(),
            token_level=False,
            chunking=False,
            max_seq_len=self.max_len,
            output_dim=self.heads.dim if colbert else out["output_dim"],
            multivector_dim=self.heads.dim,
            pooling_strategy="NONE" if colbert else PoolingStrategy.CLS_TOKEN.value,
            normalize=not colbert,  # BGE-M3's dense vector; every token vector is normalized here
            output_dtype="float32",
        )
        if colbert:
            out.update(query_length=self.heads.query_length, document_length=self.max_len)
        return out

    # -- tokens ---------------------------------------------------------------------------

    def tokenize(
        self,
        texts: Sequence[Any],
        *,
        is_tokenized: bool = False,
        keep_tokens: bool = False,
        chunk: bool = False,
        truncation_direction: str = "right",
        reads: str = "",
    ) -> TokenizedBatch:
        """Ids of ``texts`` read as documents, or as ``reads`` says: ``"query"`` (a ColBERT
        query), or ``"pairs"`` (rerank pairs ``query ||| document``: each row the query's
        positions then the document's, their segment ids saying which)."""
        if chunk:
            raise ValueError(f"{named(self.heads.kind)} encodes no long input in windows: it truncates")
        if reads not in ("", "query", "pairs"):
            raise ValueError(f"unknown reading {reads!r}")
        options = dict(is_tokenized=is_tokenized, keep_tokens=keep_tokens, truncation_direction=truncation_direction)
        if reads != "pairs":
            return self._read(texts, query=reads == "query", **options)
        sides = [split_pair(text) if isinstance(text, str) else text for text in texts]
        if is_tokenized or not all(isinstance(side, tuple) for side in sides):
            raise ValueError("a rerank input must be a pair of texts, query ||| document")
        queries = self._read([side[0] for side in sides], query=True, **options)
        documents = self._read([side[1] for side in sides], query=False, **options)
        return _joined(queries, documents)

    def _read(self, texts: Sequence[Any], *, query: bool, **options: Any) -> TokenizedBatch:
        heads = self.heads
        if heads.kind == "bge-m3":
            batch = self.encoder.tokenize(texts, **options)
            batch.segment_ids = _marked(batch, QUERY if query else DOCUMENT)
            return batch
        tokenizer = self._queries if query else self._documents
        assert tokenizer is not None
        if not options["is_tokenized"]:  # as sentence-transformers' Transformer module, which PyLate's reads through
            texts = [text.strip() for text in texts]
        batch = tokenizer.tokenize(texts, **options)
        prefix = heads.query_prefix if query else heads.document_prefix
        if prefix is not None:
            batch = _with_prefix(batch, prefix, tokenizer.tokens_of([prefix]) if batch.tokens is not None else [])
        batch.segment_ids = _marked(batch, QUERY if query else DOCUMENT)
        if query and heads.expansion is not None:
            batch = _expanded(batch, heads.query_length, heads.expansion, heads.attend_expansion)
        return batch

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """BGE-M3's dense vectors of ``texts``, normalized, as ``Encoder.encode`` gives an
        encoder's (``bertserve embed``); a ColBERT model has no sentence vector."""
        if "embed" not in self.head.tasks:
            raise ModelError(
                f"{named(self.heads.kind)} gives token vectors, not one vector a sentence: serve it and ask "
                "/embed_multivector or BertClient.encode_multivector"
            )
        dense = self.run_tasks(self.tokenize(list(texts)), {"embed": np.arange(len(texts))})["embed"]
        return dense / np.maximum(np.linalg.norm(dense, axis=-1, keepdims=True), 1e-12)

    # -- model runs -------------------------------------------------------------------------

    def run(self, batch: TokenizedBatch) -> np.ndarray:
        """The model's own task's output for every row of ``batch``."""
        return self.run_tasks(batch, {self.head.task: np.arange(len(batch))})[self.head.task]

    def token_slots(self, batch: TokenizedBatch) -> int:
        return int(np.count_nonzero(batch.input_ids)) + len(batch)

    def plan(self, batch: TokenizedBatch) -> list[np.ndarray]:
        return [np.arange(len(batch))]

    def run_tasks(self, batch: TokenizedBatch, tasks: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """For each task asked, its output for its rows of ``batch`` (in their order), all from
        one run of each row: ``embed`` ``(n, hidden)``, ``sparse`` ``(n, K, 2)`` ``[id, weight]``
        pairs, ``multivector`` ``(n, T, dim)`` (zero rows pad), ``rerank`` ``(n, 1)`` MaxSim of
        pair rows (a batch of rerank pairs answers nothing else)."""
        unknown = set(tasks) - set(self.head.tasks)
        if unknown:
            raise ValueError(f"{named(self.heads.kind)} does not answer {', '.join(sorted(unknown))}")
        if "rerank" in tasks:
            return {"rerank": self._maxsim(batch, np.asarray(tasks["rerank"], np.int64))}
        wanted = np.unique(np.concatenate([np.asarray(rows, np.int64) for rows in tasks.values()]))
        sequences = [_row(batch, row) for row in wanted.tolist()]
        states = dict(zip(wanted.tolist(), self._hidden(sequences), strict=True))
        ids = dict(zip(wanted.tolist(), (sequence[0] for sequence in sequences), strict=True))
        queries = batch.segment_ids[:, 0] == QUERY
        out: dict[str, np.ndarray] = {}
        for task, rows in tasks.items():
            kept = [int(row) for row in rows]
            if task == "embed":
                dense = [states[row][0] for row in kept]
                out[task] = np.stack(dense) if dense else np.zeros((0, self.encoder.output_dim), np.float32)
            elif task == "sparse":
                out[task] = self._sparse([states[row] for row in kept], [ids[row] for row in kept])
            else:
                kept_states = [self._kept(states[row], ids[row], query=bool(queries[row])) for row in kept]
                out[task] = self._padded_vectors(kept_states)
        return out

    def _hidden(self, sequences: list[tuple[np.ndarray, int]]) -> list[np.ndarray]:
        """The last layer at every position of each ``(ids, attended)`` sequence, ``(len(ids),
        hidden)`` float32: runs of at most ``batch_size`` sequences of like length, each
        attending to its first ``attended`` positions (a query's unattended expansion is
        computed, not attended to)."""
        widths = np.asarray([len(ids) for ids, _ in sequences], np.int64)
        out: list[np.ndarray] = [np.zeros((0, 0), np.float32)] * len(sequences)
        order = np.argsort(widths, kind="stable")
        size = max(1, self.config.batch_size)
        for start in range(0, len(order), size):
            index = order[start : start + size]
            width = max(int(widths[index].max(initial=1)), 1)
            ids = np.zeros((len(index), width), np.int32)
            for place, row in enumerate(index.tolist()):
                ids[place, : widths[row]] = sequences[row][0]
            attended = np.asarray([sequences[row][1] for row in index.tolist()], np.int32)
            run = TokenizedBatch(ids, np.zeros_like(ids), attended, np.zeros(len(index), bool))
            states = np.asarray(self.encoder.run_padded(run), dtype=np.float32)
            for place, row in enumerate(index.tolist()):
                out[row] = states[place, : widths[row]]
        return out

    def _kept(self, state: np.ndarray, ids: np.ndarray, *, query: bool) -> np.ndarray:
        """The states of a sequence's positions that get a vector: BGE-M3's all but the first; a
        ColBERT query's all (its expansion among them), a ColBERT document's all but its skiplist's."""
        heads = self.heads
        if heads.kind == "bge-m3":
            return state[1:]
        return state[~np.isin(ids, list(heads.skipped))] if not query else state

    def _project(self, kept: np.ndarray) -> np.ndarray:
        """Token vectors of ``kept`` states, normalized, float32."""
        vectors = kept @ self.heads.kernel
        if self.heads.bias is not None:
            vectors += self.heads.bias
        vectors /= np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
        return vectors.astype(np.float32, copy=False)

    def _vectors(self, state: np.ndarray, ids: np.ndarray, *, query: bool) -> np.ndarray:
        """A sequence's token vectors (:meth:`_kept`'s positions)."""
        return self._project(self._kept(state, ids, query=query))

    def _padded_vectors(self, kept: list[np.ndarray]) -> np.ndarray:
        """``(n, T, dim)``: the token vectors of each row's ``kept`` states, zero rows after them.
        One product for every row's tokens: a product per row costs several times more in bulk."""
        lengths = np.asarray([len(states) for states in kept], np.int64)
        out = np.zeros((len(kept), int(lengths.max(initial=0)), self.heads.dim), np.float32)
        if lengths.sum():
            out[np.arange(out.shape[1]) < lengths[:, None]] = self._project(np.concatenate(kept))
        return out

    def _sparse(self, states: list[np.ndarray], ids: list[np.ndarray]) -> np.ndarray:
        """Each row's ``[id, weight]`` pairs, ids ascending: the largest weight of each id."""
        assert self.heads.sparse is not None
        weight, bias = self.heads.sparse
        rows = []
        for state, row_ids in zip(states, ids, strict=True):
            weights = np.maximum(state @ weight + bias, 0.0)
            keep = (weights > 0) & ~np.isin(row_ids, list(self.heads.dropped))
            terms: dict[int, float] = {}
            for token, value in zip(row_ids[keep].tolist(), weights[keep].tolist(), strict=True):
                terms[token] = max(value, terms.get(token, 0.0))
            rows.append(np.asarray(sorted(terms.items()), np.float32).reshape(-1, 2))
        return _padded(rows, 2)

    def _maxsim(self, batch: TokenizedBatch, rows: np.ndarray) -> np.ndarray:
        """The MaxSim score of each pair row of ``rows``, ``(n, 1)``: a query is run once
        however many pairs hold it."""
        sequences: list[tuple[np.ndarray, int]] = []
        seen: dict[bytes, int] = {}
        places: list[tuple[int, int]] = []
        for row in rows.tolist():
            query, document = _pair(batch, row, self.heads.attend_expansion)
            key = query[0].tobytes() + bytes([query[1] % 256])
            if key not in seen:
                seen[key] = len(sequences)
                sequences.append(query)
            places.append((seen[key], len(sequences)))
            sequences.append(document)
        states = self._hidden(sequences)
        queries = {query for query, _ in places}
        vectors = [
            self._vectors(state, ids, query=i in queries)
            for i, (state, (ids, _)) in enumerate(zip(states, sequences, strict=True))
        ]
        scores = np.zeros((len(rows), 1), np.float32)
        for place, (asked, answered) in enumerate(places):
            best = (vectors[asked] @ vectors[answered].T).max(axis=1)
            scores[place, 0] = best.sum() if self.heads.kind == "colbert" else best.mean()
        return scores


def _row(batch: TokenizedBatch, row: int) -> tuple[np.ndarray, int]:
    """A row's positions that get a state (its tokens, and a query's expansion), and how many
    of them are attended to."""
    width = int(np.count_nonzero(batch.segment_ids[row]))
    return batch.input_ids[row, :width], int(batch.lengths[row])


def _pair(batch: TokenizedBatch, row: int, attend_expansion: bool) -> tuple[tuple[np.ndarray, int], ...]:
    """A rerank row's query and document, each as :func:`_row` gives a row."""
    segments = batch.segment_ids[row]
    query = np.isin(segments, (QUERY, EXPANSION))
    attended = int(np.count_nonzero(query if attend_expansion else segments == QUERY))
    return (batch.input_ids[row, query], attended), (
        batch.input_ids[row, segments == DOCUMENT],
        int(np.count_nonzero(segments == DOCUMENT)),
    )


def _joined(queries: TokenizedBatch, documents: TokenizedBatch) -> TokenizedBatch:
    """Rerank rows: each query's positions, then its document's (:data:`DOCUMENT`)."""
    n = len(queries)
    query_widths = np.count_nonzero(queries.segment_ids, axis=1)
    width = int((query_widths + documents.lengths).max(initial=1))
    ids = np.zeros((n, width), np.int32)
    segments = np.zeros((n, width), np.int32)
    for row in range(n):
        q, d = int(query_widths[row]), int(documents.lengths[row])
        ids[row, :q], ids[row, q : q + d] = queries.input_ids[row, :q], documents.input_ids[row, :d]
        segments[row, :q], segments[row, q : q + d] = queries.segment_ids[row, :q], DOCUMENT
    tokens = None
    if queries.tokens is not None and documents.tokens is not None:
        tokens = [[*q, *d] for q, d in zip(queries.tokens, documents.tokens, strict=True)]
    lengths = (queries.lengths + documents.lengths).astype(np.int32)
    return TokenizedBatch(ids, segments, lengths, queries.truncated | documents.truncated, tokens)


def _padded(rows: list[np.ndarray], width: int) -> np.ndarray:
    """``(n, T, width)`` float32: each row's ``(t, width)`` array, zero rows after it."""
    out = np.zeros((len(rows), max((len(row) for row in rows), default=0), width), np.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def _marked(batch: TokenizedBatch, marker: int) -> np.ndarray:
    """Segment ids marking each row's tokens with ``marker`` (:data:`QUERY` or
    :data:`DOCUMENT`), padding 0: the encoder is run with none, so they say only what each
    position of a row is."""
    return np.where(batch.input_mask > 0, marker, 0).astype(np.int32)


def _with_prefix(batch: TokenizedBatch, prefix: int, tokens: list[str]) -> TokenizedBatch:
    """``batch`` with ``prefix`` put after each row's first token ([CLS])."""
    n, width = batch.input_ids.shape
    ids = np.zeros((n, width + 1), np.int32)
    ids[:, :1], ids[:, 1], ids[:, 2:] = batch.input_ids[:, :1], prefix, batch.input_ids[:, 1:]
    shown = None if batch.tokens is None else [[*row[:1], *tokens, *row[1:]] for row in batch.tokens]
    return TokenizedBatch(ids, np.zeros_like(ids), (batch.lengths + 1).astype(np.int32), batch.truncated, shown)


def _expanded(batch: TokenizedBatch, length: int, mask: int, attended: bool) -> TokenizedBatch:
    """Queries padded with ``mask`` to ``length`` positions (their segment ids saying which)."""
    n = len(batch)
    ids = np.zeros((n, length), np.int32)
    segments = np.full((n, length), EXPANSION, np.int32)
    for row, real in enumerate(batch.lengths.tolist()):
        ids[row, :real], ids[row, real:] = batch.input_ids[row, :real], mask
        segments[row, :real] = QUERY
    lengths = np.full(n, length, np.int32) if attended else batch.lengths
    return TokenizedBatch(ids, segments, lengths.astype(np.int32), batch.truncated, batch.tokens)
