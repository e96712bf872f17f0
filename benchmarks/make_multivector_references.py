"""Build ``tests/data/multivector/``: tiny random multi-vector models (BGE-M3's three heads, PyLate
ColBERT models), made and saved by the libraries that define them, with what those libraries
compute for them, for the tests to compare a reimplementation's dense, sparse and per-token
vectors and its late-interaction scores with.

Needs torch 2.13.0 (the local CPU build), transformers, sentence-transformers, FlagEmbedding
1.4.2 and pylate 1.6.0; no network, no downloaded weights. pylate 1.6.0 pins
sentence-transformers 5.3.0 and transformers <= 5.3.0, and its index backend fast-plaid pins an
old torch: install pylate and FlagEmbedding with ``--no-deps`` over the rest (neither model class
imports fast-plaid, ir-datasets or peft's training parts)::

    pip install torch==2.13.0 transformers==5.3.0 sentence-transformers==5.3.0 \\
        datasets accelerate pandas ujson==5.12.0 peft sentencepiece protobuf
    pip install --no-deps FlagEmbedding==1.4.2 pylate==1.6.0
    python benchmarks/make_multivector_references.py              # everything
    python benchmarks/make_multivector_references.py --only bge_m3

Each model is randomly initialized as the families' are (seeded, ``initializer_range`` 0.2,
every 1-d weight and bias moved off its 1/0 start; hidden 32, 2 layers, 4 heads, intermediate
64; ModernBERT as families/modernbert but hidden 32, 2 layers: layer 0 global, layer 1 local
with a window of 8) with the family's tokenizer from ``tests/data/families/`` saved again with
``model_max_length`` 32. Inputs: N = 40 texts of ``tests/data/sentences.json`` (``TEXT_ROWS``:
rows 0, 4, ..., 116 and 120-129; 11 to 17 of them cut at 32 tokens, the 300-token row 129
among them), Q = 5 short queries (``QUERY_ROWS``) and D = 24 documents (``DOCUMENT_ROWS``),
the rows of ``make_task_references.py``. Every number is computed on the CPU in float32.

The models and their layouts:

    bge_m3               as BAAI/bge-m3 is on the Hub: an ``XLMRobertaModel`` (config.json,
                         model.safetensors, the xlm_roberta tokenizer's two files), the
                         sentence-transformers modules of its dense vector (modules.json with
                         ``sentence_transformers.models.Transformer``, ``Pooling`` in 1_Pooling/
                         with ``pooling_mode_cls_token``, ``Normalize`` in 2_Normalize/,
                         sentence_bert_config.json ``max_seq_length`` 32), and FlagEmbedding's two
                         heads at the root: ``sparse_linear.pt`` = ``torch.save(nn.Linear(32, 1)
                         .state_dict())`` and ``colbert_linear.pt`` = ``torch.save(nn.Linear(32, 32)
                         .state_dict())`` (an OrderedDict of ``weight`` [out, in] and ``bias`` [out],
                         float32, torch's zip format). The sparse bias is set so that 60% of the
                         texts' token positions have a positive pre-activation.
    colbert_bert         a PyLate ColBERT on a ``BertModel`` (bert_st6's WordPiece), as
                         answerdotai/answerai-colbert-small-v1 is laid out: modules.json with
                         ``sentence_transformers.models.Transformer`` and
                         ``pylate.models.Dense.Dense`` in 1_Dense/ (32 -> 16, no bias, Identity),
                         config_sentence_transformers.json with the ColBERT settings. Prefixes
                         ``[unused0]``/``[unused1]`` (answerai's), which bert_st6's vocabulary
                         lacks, so PyLate adds them as tokens 700/701 and grows the embeddings.
    colbert_modernbert   the same on a ``ModernBertModel`` (families/modernbert's byte-level BPE),
                         as lightonai/GTE-ModernColBERT-v1: PyLate's default prefixes ``[Q] ``/``[D] ``
                         added as tokens, Dense 32 -> 16 without bias.

Both ColBERT models: ``query_length`` 12 (so that queries are cut, and shorter ones expanded),
``document_length`` 32, ``do_query_expansion`` true, ``attend_to_expansion_tokens`` false, the
skiplist ``string.punctuation``.

``multivector/bge_m3.npz`` (T = the longest row, at most 32; H = 32; K = the most non-zero ids
of a text):

    texts                    (N,) str
    ids, lengths             (N, T), (N,) int32  ``tokenizer(text, truncation=True, max_length=32)``
    dense                    (N, H) float32  ``dense_vecs``: the [CLS] (<s>) state, L2-normalized
    sparse_ids, sparse_weights (N, K) int32, float32  ``lexical_weights`` in the dict's order (the
                             order of each id's first position), 0-padded, with
    sparse_counts            (N,) int32
    colbert                  (N, T-1, H) float32  ``colbert_vecs``: one row per token after <s>,
                             </s> included, 0-padded, with
    colbert_counts           (N,) int32      lengths - 1
    queries, documents       (Q,), (D,) str
    query_dense, document_dense ..., query_colbert, document_colbert, query_colbert_counts,
    document_colbert_counts, query_sparse_ids/_weights/_counts, document_sparse_...: the same
                             for the queries and documents, encoded apart (max_length 32)
    sparse_linear_weight, sparse_linear_bias, colbert_linear_weight, colbert_linear_bias
                             (1, H), (1,), (H, H), (H,) float32  the two .pt files as
                             ``torch.load(weights_only=True)`` reads them
    dense_scores             (Q, D) float32  query_dense @ document_dense.T
    sparse_scores            (Q, D) float32  ``compute_lexical_matching_score``
    colbert_scores           (Q, D) float32  ``colbert_score(q, d)``: the mean over the query's
                             rows of the max dot over the document's rows
    compute_score_<mode>     (Q, D) float32  ``compute_score(pairs, max_query_length=32,
                             max_passage_length=32)``, mode colbert, sparse, dense, sparse+dense,
                             colbert+sparse+dense (weights 1, 1, 1); ``compute_score_colbert``
                             differs from ``colbert_scores``: see meta's ``notes``

``multivector/colbert_<family>.npz`` (L = query_length 12; E = 16):

    texts                    (N,) str
    query_ids, query_mask    (N, L) int32    the ids PyLate gives the model for ``is_query=True``
                             ([CLS], the prefix, the text's tokens cut at L - 2 ... [SEP], then
                             [MASK] up to L) and the attention mask (0 on the expansion)
    query_colbert            (N, L, E) float32  ``encode(texts, is_query=True)``: all L rows,
                             expansion included, each L2-normalized
    document_ids, document_mask (N, 32) int32  the same for ``is_query=False`` (padded with 0
                             here; the mask 0 there)
    document_kept            (N, 32) int32   1 where ``encode(is_query=False)`` keeps the row:
                             attention mask and not in the skiplist
    document_colbert         (N, 32, E) float32  the kept rows, 0-padded, with
    document_counts          (N,) int32
    queries, documents       (Q,), (D,) str
    scores                   (Q, D) float32  ``pylate.scores.colbert_scores`` of one query and one
                             document at a time: sum over the query's L rows of the max dot
    scores_padded            (Q, D) float32  the same on the documents 0-padded into one batch,
                             as ``pylate.rank.rerank`` does: a padded row's dot 0 takes part in the max

Each npz holds ``meta`` () str, JSON, also written beside it as ``multivector/<name>.json``: the
versions, the CPU, config.json and the other configuration files as saved, the tokenizer's
specials, the rows, the settings, and ``notes``: what a reimplementation must match.
"""

from __future__ import annotations

import argparse
import json
import shutil
import string
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import FlagEmbedding
import numpy as np
import pylate
import sentence_transformers
import tokenizers
import torch
import transformers
from FlagEmbedding import BGEM3FlagModel
from lib.reference_stack import FAMILIES, FAMILIES_DIR, ROBERTA_IDS, SENTENCES, SMALL, tokenizer_meta
from lib.references import cpu, padded
from pylate import models as pylate_models, scores as pylate_scores
from sentence_transformers import SentenceTransformer, models as st_models

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "data" / "multivector"

MAX_LENGTH = 32
QUERY_ROWS = (73, 22, 37, 121, 108)
DOCUMENT_ROWS = (5, 3, 26, 120, 129, 124, 0, 28, 98, 65, 18, 72, 88, 13, 36, 91, 128, 102, 104, 123, 125, 93, 59, 67)
TEXT_ROWS = tuple(range(0, 120, 4)) + tuple(range(120, 130))
SPARSE_POSITIVE = 0.6  # the share of the texts' token positions whose sparse weight is above 0
COLBERT_DIM = 16
QUERY_LENGTH = 12
DOCUMENT_LENGTH = 32

_FAMILY_CONFIGS = {family.name: family.config for family in FAMILIES}
CONFIGS: dict[str, dict[str, Any]] = {
    "xlm_roberta": dict(model_type="xlm-roberta", **SMALL, **ROBERTA_IDS, type_vocab_size=1),
    "bert_st6": _FAMILY_CONFIGS["bert_st6"],
    "modernbert": {**_FAMILY_CONFIGS["modernbert"], **SMALL, "global_attn_every_n_layers": 2},
}
COLBERTS = {  # name: (family, query prefix, document prefix)
    "colbert_bert": ("bert_st6", "[unused0]", "[unused1]"),
    "colbert_modernbert": ("modernbert", "[Q] ", "[D] "),
}


def _tokenizer(family: str) -> Any:
    tokenizer = transformers.AutoTokenizer.from_pretrained(FAMILIES_DIR / family)
    tokenizer.model_max_length = MAX_LENGTH
    return tokenizer


def _encoder(family: str, tokenizer: Any, seed: str) -> Any:
    """The family's tiny random encoder, 1-d weights moved off their 1/0 start."""
    torch.manual_seed(sum(map(ord, seed)))
    ids = {}
    if family == "modernbert":
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        ids = dict(
            pad_token_id=tokenizer.pad_token_id, cls_token_id=cls, sep_token_id=sep, bos_token_id=cls, eos_token_id=sep
        )
    config = transformers.AutoConfig.for_model(
        **CONFIGS[family], **ids, vocab_size=len(tokenizer), initializer_range=0.2
    )
    model = transformers.AutoModel.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 1:
                parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


def _random_linear(in_features: int, out_features: int) -> torch.nn.Linear:
    linear = torch.nn.Linear(in_features, out_features)
    with torch.no_grad():
        linear.weight.normal_(0.0, 0.2)
        linear.bias.normal_(0.0, 0.1)
    return linear


# -- BGE-M3 -------------------------------------------------------------------------------------


def build_bge_m3(sentences: list[str], out: Path) -> None:
    tokenizer = _tokenizer("xlm_roberta")
    model = _encoder("xlm_roberta", tokenizer, "bge_m3")
    hidden = model.config.hidden_size
    sparse, colbert = _random_linear(hidden, 1), _random_linear(hidden, hidden)
    with torch.no_grad():  # the bias set so that SPARSE_POSITIVE of the token positions weigh > 0
        batch = tokenizer([sentences[i] for i in TEXT_ROWS], truncation=True, padding=True, return_tensors="pt")
        states = model(**batch).last_hidden_state[batch["attention_mask"].bool()]
        logits = (states @ sparse.weight.T)[:, 0]
        sparse.bias.fill_(-float(torch.quantile(logits, 1 - SPARSE_POSITIVE)))
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        modules = [
            st_models.Transformer(tmp, max_seq_length=MAX_LENGTH),
            st_models.Pooling(hidden, pooling_mode="cls"),
            st_models.Normalize(),
        ]
        SentenceTransformer(modules=modules, device="cpu").save(str(out), create_model_card=False)
    torch.save(sparse.state_dict(), out / "sparse_linear.pt")
    torch.save(colbert.state_dict(), out / "colbert_linear.pt")


def _lexical_arrays(prefix: str, weights: list[dict[str, float]]) -> dict[str, np.ndarray]:
    ids, counts = padded([[int(k) for k in w] for w in weights])
    values = np.zeros(ids.shape, np.float32)
    for i, w in enumerate(weights):
        values[i, : len(w)] = [float(v) for v in w.values()]
    return {f"{prefix}sparse_ids": ids, f"{prefix}sparse_weights": values, f"{prefix}sparse_counts": counts}


def _rows(prefix: str, name: str, vectors: list[np.ndarray], width: int | None = None) -> dict[str, np.ndarray]:
    counts = np.asarray([len(v) for v in vectors], np.int32)
    out = np.zeros((len(vectors), width or int(counts.max()), vectors[0].shape[1]), np.float32)
    for i, v in enumerate(vectors):
        out[i, : len(v)] = v
    return {f"{prefix}{name}": out, f"{prefix}{name}_counts": counts}


def _m3_encode(m3: Any, prefix: str, texts: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    out = m3.encode(texts, max_length=MAX_LENGTH, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    arrays = {f"{prefix}dense": np.asarray(out["dense_vecs"], np.float32)}
    arrays.update(_lexical_arrays(prefix, out["lexical_weights"]))
    arrays.update(_rows(prefix, "colbert", [np.asarray(v, np.float32) for v in out["colbert_vecs"]]))
    return arrays, out


def bge_m3_references(out: Path, sentences: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    m3 = BGEM3FlagModel(str(out), use_fp16=False, devices="cpu")
    tokenizer = m3.tokenizer
    texts = [sentences[i] for i in TEXT_ROWS]
    queries = [sentences[i] for i in QUERY_ROWS]
    documents = [sentences[i] for i in DOCUMENT_ROWS]
    encoded = [tokenizer(t, truncation=True, max_length=MAX_LENGTH)["input_ids"] for t in texts]
    ids, lengths = padded(encoded)
    arrays: dict[str, np.ndarray] = {"texts": np.asarray(texts, dtype=np.str_), "ids": ids, "lengths": lengths}
    text_arrays, text_out = _m3_encode(m3, "", texts)
    arrays.update(text_arrays)
    for head in ("sparse_linear", "colbert_linear"):  # as torch.load reads them: weight [out, in], bias [out]
        for key, value in torch.load(out / f"{head}.pt", map_location="cpu", weights_only=True).items():
            arrays[f"{head}_{key}"] = value.numpy()
    assert (arrays["colbert_counts"] == lengths - 1).all()
    q_arrays, q_out = _m3_encode(m3, "query_", queries)
    d_arrays, d_out = _m3_encode(m3, "document_", documents)
    arrays.update(queries=np.asarray(queries, dtype=np.str_), documents=np.asarray(documents, dtype=np.str_))
    arrays.update(q_arrays)
    arrays.update(d_arrays)
    arrays["dense_scores"] = (arrays["query_dense"] @ arrays["document_dense"].T).astype(np.float32)
    arrays["sparse_scores"] = np.asarray(
        m3.compute_lexical_matching_score(q_out["lexical_weights"], d_out["lexical_weights"]), np.float32
    )
    arrays["colbert_scores"] = np.asarray(
        [[float(m3.colbert_score(q, d)) for d in d_out["colbert_vecs"]] for q in q_out["colbert_vecs"]], np.float32
    )
    pairs = [(q, d) for q in queries for d in documents]
    scored = m3.compute_score(pairs, max_query_length=MAX_LENGTH, max_passage_length=MAX_LENGTH)
    for mode, values in scored.items():
        arrays[f"compute_score_{mode}"] = np.asarray(values, np.float32).reshape(len(queries), len(documents))
    # FlagEmbedding's own formulas, by hand, give the same numbers; sentence-transformers' dense too
    st_dense = SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(st_dense, arrays["dense"], atol=1e-5)
    np.testing.assert_allclose(arrays["compute_score_dense"], arrays["dense_scores"], atol=1e-5)
    np.testing.assert_allclose(arrays["compute_score_sparse"], arrays["sparse_scores"], atol=1e-5)
    dropped = sorted({tokenizer.convert_tokens_to_ids(tokenizer.special_tokens_map[t]) for t in _M3_DROPPED})
    for row, weights in zip(encoded, text_out["lexical_weights"], strict=True):
        assert not set(map(int, weights)) & set(dropped)
        assert set(map(int, weights)) <= set(row)
    kept = [[t for t in row if t not in dropped] for row in encoded]
    repeated = [TEXT_ROWS[i] for i, row in enumerate(kept) if len(set(row)) < len(row)]
    meta = {
        "name": "bge_m3",
        "files": sorted(p.name for p in out.iterdir()),
        "config": json.loads((out / "config.json").read_text()),
        "modules": json.loads((out / "modules.json").read_text()),
        "pooling": json.loads((out / "1_Pooling" / "config.json").read_text()),
        "sentence_bert_config": json.loads((out / "sentence_bert_config.json").read_text()),
        "tokenizer": tokenizer_meta(out, tokenizer),
        "heads": {
            "sparse_linear.pt": {"weight": [1, 32], "bias": [1], "dtype": "float32"},
            "colbert_linear.pt": {"weight": [32, 32], "bias": [32], "dtype": "float32"},
        },
        "text_rows": TEXT_ROWS,
        "query_rows": QUERY_ROWS,
        "document_rows": DOCUMENT_ROWS,
        "max_length": MAX_LENGTH,
        "texts_longer_than_max_length": int(sum(len(tokenizer(t)["input_ids"]) > MAX_LENGTH for t in texts)),
        "texts_with_a_repeated_id": repeated,
        "sparse_dropped_ids": dropped,
        "sparse_dropped_tokens": {t: tokenizer.special_tokens_map[t] for t in _M3_DROPPED},
        "sparse_nonzero_per_text": [int(c) for c in arrays["sparse_counts"]],
        "encode_call": "BGEM3FlagModel(dir, use_fp16=False, devices='cpu').encode(texts, max_length=32, "
        "return_dense=True, return_sparse=True, return_colbert_vecs=True) (batch_size 256: one batch, "
        "sorted by length, right-padded with <pad>)",
        "compute_score_colbert_max_difference": float(
            np.abs(arrays["compute_score_colbert"] - arrays["colbert_scores"]).max()
        ),
        "notes": _M3_NOTES,
    }
    return arrays, meta


_M3_DROPPED = ("cls_token", "eos_token", "pad_token", "unk_token")
_M3_NOTES = [
    "ids: tokenizer(text, truncation=True, max_length=32): <s> ... </s>, at most 32 tokens in all; no "
    "token_type_ids are given to the model (XLM-R's tokenizer makes none)",
    "dense: last_hidden_state[:, 0] (the <s> state), then torch.nn.functional.normalize (L2, eps 1e-12)",
    "sparse: relu(sparse_linear(last_hidden_state)) per token (weight [1, H] and bias), then per text a dict "
    "str(id) -> the max weight over the positions of that id, keeping only weights > 0 and dropping the ids "
    "of the tokenizer's cls_token, eos_token, pad_token and unk_token (<s> 0, </s> 2, <pad> 1, <unk> 3 "
    "here); <mask> and any other id are kept. Not normalized. The dict's order is each id's first position",
    "lexical matching score: sum over the ids the two dicts share of w_q * w_d",
    "colbert: colbert_linear(last_hidden_state[:, 1:]) (weight [H, H] and bias, no activation), "
    "times the attention mask, then L2-normalized per row; kept: the first lengths - 1 rows, so "
    "every token after <s>, the closing </s> included",
    "colbert_score(q, p) (M3Embedder.colbert_score): (q @ p.T).max(-1).sum() / len(q), the mean over the query's rows",
    "compute_score: queries and passages tokenized apart in batches of pairs (max_query_length, "
    "max_passage_length, padding=True); dense = q.p of the normalized dense vectors; sparse = dot of "
    "vocabulary-sized vectors (scatter amax of the token weights, the four dropped ids zeroed) = the "
    "lexical matching score; colbert = sum over query rows of the max over all the padded passage "
    "rows, divided by the query's rows: a passage shorter than the longest passage of its batch has "
    "0-vector rows (masked, and normalize(0) = 0) that take part in the max, so compute_score_colbert "
    "takes max(..., 0) per query row where colbert_scores does not (the same here: no query row's best "
    "dot is below 0; meta's compute_score_colbert_max_difference); the modes sparse+dense and "
    "colbert+sparse+dense are weighted means with weights [dense 1, sparse 1, colbert 1]",
    "the model runs in float32 on the CPU (use_fp16=False; on a CPU FlagEmbedding calls model.float())",
]


# -- PyLate ColBERT ------------------------------------------------------------------------------


def build_colbert(name: str, out: Path) -> None:
    family, query_prefix, document_prefix = COLBERTS[name]
    tokenizer = _tokenizer(family)
    model = _encoder(family, tokenizer, name)
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.manual_seed(sum(map(ord, name + "/dense")))
        colbert = pylate_models.ColBERT(
            tmp,
            device="cpu",
            embedding_size=COLBERT_DIM,
            query_prefix=query_prefix,
            document_prefix=document_prefix,
            query_length=QUERY_LENGTH,
            document_length=DOCUMENT_LENGTH,
        )
        colbert.save(str(out), create_model_card=False)


def _tokenized(model: Any, texts: list[str], is_query: bool) -> dict[str, np.ndarray]:
    features = model.tokenize(texts, is_query=is_query)
    return {k: features[k].numpy().astype(np.int32) for k in ("input_ids", "attention_mask")}


def colbert_references(name: str, out: Path, sentences: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    model = pylate_models.ColBERT(str(out), device="cpu")
    tokenizer = model.tokenizer
    texts = [sentences[i] for i in TEXT_ROWS]
    arrays: dict[str, np.ndarray] = {"texts": np.asarray(texts, dtype=np.str_)}
    query = _tokenized(model, texts, is_query=True)
    arrays.update(query_ids=query["input_ids"], query_mask=query["attention_mask"])
    query_vectors = model.encode(texts, is_query=True, show_progress_bar=False)
    assert all(len(v) == QUERY_LENGTH for v in query_vectors)
    arrays["query_colbert"] = np.stack(query_vectors).astype(np.float32)
    document = [_tokenized(model, [t], is_query=False) for t in texts]
    arrays["document_ids"] = padded([d["input_ids"][0].tolist() for d in document], DOCUMENT_LENGTH)[0]
    arrays["document_mask"] = padded([d["attention_mask"][0].tolist() for d in document], DOCUMENT_LENGTH)[0]
    skip = set(model.skiplist)
    arrays["document_kept"] = ((arrays["document_mask"] == 1) & ~np.isin(arrays["document_ids"], sorted(skip))).astype(
        np.int32
    )
    document_vectors = model.encode(texts, is_query=False, show_progress_bar=False)
    rows = _rows("", "document_colbert", [np.asarray(v, np.float32) for v in document_vectors], DOCUMENT_LENGTH)
    arrays["document_colbert"], arrays["document_counts"] = rows["document_colbert"], rows["document_colbert_counts"]
    assert (arrays["document_counts"] == arrays["document_kept"].sum(1)).all()
    queries = [sentences[i] for i in QUERY_ROWS]
    documents = [sentences[i] for i in DOCUMENT_ROWS]
    arrays.update(queries=np.asarray(queries, dtype=np.str_), documents=np.asarray(documents, dtype=np.str_))
    q_vectors = model.encode(queries, is_query=True, show_progress_bar=False)
    d_vectors = model.encode(documents, is_query=False, show_progress_bar=False)
    arrays["scores"] = np.asarray(
        [[float(pylate_scores.colbert_scores([q], [d])[0, 0]) for d in d_vectors] for q in q_vectors], np.float32
    )
    batch = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(d) for d in d_vectors], batch_first=True)
    arrays["scores_padded"] = pylate_scores.colbert_scores(np.stack(q_vectors), batch).numpy().astype(np.float32)
    by_hand = np.asarray([[(q @ d.T).max(1).sum() for d in d_vectors] for q in q_vectors], np.float32)
    np.testing.assert_allclose(arrays["scores"], by_hand, atol=1e-5)
    config_st = json.loads((out / "config_sentence_transformers.json").read_text())
    skip_tokens = {w: tokenizer.convert_tokens_to_ids(w) for w in model.skiplist_words}
    meta = {
        "name": name,
        "family": COLBERTS[name][0],
        "files": sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()),
        "config": json.loads((out / "config.json").read_text()),
        "modules": json.loads((out / "modules.json").read_text()),
        "dense": json.loads((out / "1_Dense" / "config.json").read_text()),
        "sentence_bert_config": json.loads((out / "sentence_bert_config.json").read_text()),
        "config_sentence_transformers": config_st,
        "tokenizer": tokenizer_meta(out, tokenizer),
        "added_tokens": json.loads((out / "tokenizer.json").read_text())["added_tokens"],
        "query_prefix": [model.query_prefix, model.query_prefix_id],
        "document_prefix": [model.document_prefix, model.document_prefix_id],
        "pad_token_id_after_load": tokenizer.pad_token_id,
        "mask_token_id": tokenizer.mask_token_id,
        "skiplist_ids": skip_tokens,
        "skiplist_words_mapped_to_unk": sorted(w for w, i in skip_tokens.items() if i == tokenizer.unk_token_id),
        "text_rows": TEXT_ROWS,
        "query_rows": QUERY_ROWS,
        "document_rows": DOCUMENT_ROWS,
        "queries_cut": int(sum(len(tokenizer(t)["input_ids"]) > QUERY_LENGTH - 1 for t in texts)),
        "documents_cut": int(sum(len(tokenizer(t)["input_ids"]) > DOCUMENT_LENGTH - 1 for t in texts)),
        "notes": _COLBERT_NOTES,
    }
    return arrays, meta


_COLBERT_NOTES = [
    "tokenize: the Transformer module's max_seq_length is set to query_length - 1 (queries) or "
    "document_length - 1 (documents) while a prefix is used; the text is tokenized ([CLS] ... [SEP], cut "
    "there), then the prefix id is inserted at position 1 (after [CLS]) with attention 1 (and token type "
    "0): [CLS] prefix tokens... [SEP], at most query_length / document_length ids in all",
    "the prefix is a token id, never text: PyLate calls tokenizer.add_tokens([query_prefix, "
    "document_prefix]) at load (a no-op if they are in the vocabulary already) and resizes the embeddings, "
    "then convert_tokens_to_ids(prefix); the saved tokenizer.json holds them as added tokens and "
    "config.json's vocab_size counts them",
    "queries (do_query_expansion true): padded to query_length - 1 with the pad token, which PyLate sets "
    "to the MASK token at load (tokenizer.pad_token_id = mask_token_id), so after the prefix insertion "
    "every query has exactly query_length ids, [MASK] after [SEP]; the attention mask is 0 on those [MASK] "
    "(attend_to_expansion_tokens false): no token attends to them, yet their output rows are kept",
    "query vectors: all query_length rows ([CLS], prefix, tokens, [SEP], the [MASK] expansion), each "
    "projected by the Dense layer (linear, no bias, Identity activation) and L2-normalized "
    "(torch.nn.functional.normalize, eps 1e-12). No skiplist for queries",
    "documents: no expansion; rows kept where the attention mask is 1 and the id is not in the "
    "skiplist; the skiplist is convert_tokens_to_ids of each character of string.punctuation, so a "
    "character the vocabulary lacks maps to the UNK id and every [UNK] of a document is dropped too "
    "(skiplist_words_mapped_to_unk); [CLS], the prefix and [SEP] are kept; each kept row L2-normalized",
    "scores: sum over the query's rows of the max dot over the document's rows (no division); "
    "colbert_scores on a 0-padded batch of documents (pylate.rank.rerank pads so, with no mask) lets a "
    "padded row's 0 take part in the max: scores_padded = scores where no query row's best dot is "
    "below 0 or the document is the longest",
]


# -- writing -------------------------------------------------------------------------------------


def _write(out_dir: Path, name: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    libraries = (sentence_transformers, transformers, torch, tokenizers, pylate)
    versions = {lib.__name__: lib.__version__ for lib in libraries}
    versions["FlagEmbedding"] = _version("FlagEmbedding")
    meta.update(versions, numpy=np.__version__, cpu=cpu()[0], cpu_flags=cpu()[1], torch_threads=torch.get_num_threads())
    arrays["meta"] = np.asarray(json.dumps(meta, ensure_ascii=False))
    for key, value in arrays.items():
        assert value.dtype not in (np.float64, np.int64, np.bool_), key
    np.savez_compressed(out_dir / f"{name}.npz", **arrays)
    (out_dir / f"{name}.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    shapes = ", ".join(f"{k} {tuple(v.shape)} {v.dtype}" for k, v in arrays.items() if k != "meta")
    print(f"wrote {name}.npz: {shapes}")


def _version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


BUILDERS: dict[str, tuple[Callable, Callable]] = {
    "bge_m3": (lambda name, s, out: build_bge_m3(s, out), lambda name, out, s: bge_m3_references(out, s)),
    **{name: (lambda name, s, out: build_colbert(name, out), colbert_references) for name in COLBERTS},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument("--only", choices=list(BUILDERS), action="append")
    args = parser.parse_args()
    sentences = json.loads(SENTENCES.read_text(encoding="utf-8"))
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(1)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    assert FlagEmbedding is not None and string.punctuation
    for name, (build, references) in BUILDERS.items():
        if args.only and name not in args.only:
            continue
        out = args.out_dir / name
        build(name, sentences, out)
        _write(args.out_dir, name, *references(name, out, sentences))


if __name__ == "__main__":
    main()
