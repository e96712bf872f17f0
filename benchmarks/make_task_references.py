"""Build ``tests/data/tasks/``: tiny random rerankers, classifiers and SPLADE models, made and
saved by the reference stack (transformers + sentence-transformers 6), with what that stack
computes for them, and the compact quantizations of a set of vectors, for the tests to compare
bertserve's rerank, classification, sparse and compact outputs with.

Needs torch, transformers, sentence-transformers, tokenizers and safetensors; no network, no
downloaded weights. Run from the repository's root; each model takes the tokenizer of its
family from ``tests/data/families/`` (``make_family_references.py``)::

    python benchmarks/make_task_references.py                        # everything
    python benchmarks/make_task_references.py --only rerank_roberta   # one model (or quantize)

Each model is randomly initialized as the families' are (seeded, ``initializer_range`` 0.2,
every 1-d weight and bias moved off its 1/0 start), with their small sizes (hidden 32, 2 layers,
4 heads, intermediate 64; DistilBERT dim 32, hidden_dim 64; ModernBERT's layer 0 global and
layer 1 local with a window of 8, RoPE theta 160000 global / 100 local) and the family's
tokenizer, loaded from ``families/<family>/`` (BERT: ``bert_st6``) and saved again with
``model_max_length`` 32. A classification head's output layer (``classifier`` or
``classifier.out_proj``) is then scaled and its bias set so that the logits of the model's own
reference inputs have mean 0 and standard deviation 1.5 for each label: scores far from ties
and from the sigmoid's flat ends, each of a classifier's labels the argmax of some texts. A
SPLADE model's output bias (``cls.predictions.bias``, ``vocab_projector.bias``) is lowered by 3,
so that a few dozen of the ~700 vocabulary entries are non-zero for a text.

The model is saved into ``tasks/<name>/`` by sentence-transformers 6.3
(``CrossEncoder(dir, max_length=32).save`` or ``SparseEncoder.save``, no model card), then
rewritten in the format it has on the Hub where ``layout`` says so:

    st6           as sentence-transformers 6.3 saves it: config.json (transformers 5's keys),
                  model.safetensors, tokenizer.json, tokenizer_config.json (model_max_length 32),
                  modules.json (one ``...base.modules.transformer.Transformer``; a SparseEncoder's
                  then ``...sparse_encoder.modules.splade_pooling.SpladePooling`` in
                  1_SpladePooling/), sentence_bert_config.json (``transformer_task``,
                  ``modality_config``, ``module_output_name``, no max_seq_length) and
                  config_sentence_transformers.json (a CrossEncoder's ``activation_fn``). Nothing
                  in config.json names the activation
    st5           a CrossEncoder as sentence-transformers 4 and 5 saved one: config.json,
                  model.safetensors and the tokenizer's two files only, config.json with
                  ``"sentence_transformers": {"activation_fn": ..., "version": "4.1.0"}``.
                  A SparseEncoder as sentence-transformers 5 saved one (the SPLADE models on the
                  Hub): modules.json naming ``sentence_transformers.sparse_encoder.models.MLMTransformer``
                  and ``...models.SpladePooling``, ``{"max_seq_length": 32, "do_lower_case": false}``
                  in sentence_bert_config.json (while tokenizer_config.json says 128),
                  ``word_embedding_dimension`` in 1_SpladePooling/config.json and
                  ``"similarity_fn_name": "dot"``
    transformers  config.json, model.safetensors and the tokenizer's two files, as transformers
                  saves them and as bge-reranker is on the Hub: no activation anywhere, so a
                  CrossEncoder takes its default, Sigmoid for one label (Identity for more)

The models (a reranker has one label; its ``scores`` are its own activation's):

    rerank_bert              BertForSequenceClassification, WordPiece; st6, Sigmoid
    rerank_bert_identity     the same weights; st6, activation_fn Identity (scores = raw logits)
    rerank_bert_identity_st5 the same weights; st5, Identity in config.json
    rerank_xlm_roberta       XLMRobertaForSequenceClassification, Unigram; transformers, Sigmoid
    rerank_roberta           RobertaForSequenceClassification, byte-level BPE; st5, Sigmoid
    rerank_distilbert        DistilBertForSequenceClassification, WordPiece; st5, Sigmoid
    rerank_mpnet             MPNetForSequenceClassification, WordPiece with <s> </s>; st5, Sigmoid
    rerank_modernbert        ModernBertForSequenceClassification, byte-level BPE; st6, Sigmoid;
                             transformers' default classifier_pooling, "cls"
    rerank_qwen3             Qwen3ForCausalLM, Qwen's byte-level BPE; transformers; scored as
                             Qwen3-Reranker's model card scores (the last section)
    classify_bert            BertForSequenceClassification, id2label negative/neutral/positive; st6
    classify_distilbert      DistilBertForSequenceClassification, NEGATIVE/POSITIVE; st5
    splade_bert              BertForMaskedLM; Transformer(transformer_task="fill-mask") and
                             SpladePooling("max", "relu"); st6
    splade_distilbert        DistilBertForMaskedLM; MLMTransformer and SpladePooling; st5

Every number below is computed by sentence-transformers 6.3 loading the final directory, on the
CPU, in float32. The inputs, from the 130 sentences of ``tests/data/sentences.json``: Q = 5
short queries (``QUERY_ROWS``) and D = 24 documents (``DOCUMENT_ROWS``), 59 (WordPiece) to 81
(byte-level BPE, Unigram) of whose 120 pairs are longer than 32 tokens; N = 40 texts
(``TEXT_ROWS``: rows 0, 4, ..., 116 and the odd ones, 120-129, the 300-token one among them)
and the families' P = 6 pairs (``PAIR_ROWS``). Ids come from the model's own tokenizer
(``AutoTokenizer`` on the directory); padding is id 0 whatever the pad token's id, with the
lengths saying where it starts. Pairs are tokenized as a CrossEncoder does:
``tokenizer(first, second, truncation="longest_first", max_length=32)``. The arrays
(T = the longest row, at most 32; V = the vocabulary; L = the labels):

``tasks/rerank_<family>.npz``, ``rerank_bert_identity.npz``, ``rerank_bert_identity_st5.npz``:

    queries, documents       (Q,), (D,) str
    scores                   (Q, D) float32  ``CrossEncoder.predict([(q, d) for d in documents])``
                                             for each q, with the model's own activation
    logits                   (Q, D) float32  the same with ``activation_fn=torch.nn.Identity()``
    rank                     (Q, D) int32    ``argsort(-scores)``, stable: the order of
                                             ``CrossEncoder.rank(q, documents)`` (checked)
    truncated                (Q, D) int32    1 where the pair is longer than 32 tokens
    pair_ids, pair_lengths   (Q*D, T), (Q*D,) int32  every (q, d) pair, row-major (q0 d0, q0 d1, ...)
    pair_type_ids            (Q*D, T) int32  the post-processor's type ids, 0-padded (the model
                                             reads them only if ``token_type_ids`` is in meta's
                                             tokenizer.model_input_names: BERT's alone here)
    pair_untruncated_lengths (Q*D,) int32    the pair's token count, untruncated

``tasks/classify_<family>.npz``:

    texts                    (N,) str
    ids, lengths             (N, T), (N,) int32  each text alone, truncated at 32
    logits                   (N, L) float32  ``predict(text, activation_fn=Identity())``, one text
                                             a call (``predict`` takes a list of strings for one pair)
    probs                    (N, L) float32  the same with ``apply_softmax=True``
    labels                   (N,) str        the argmax's name in config.json's id2label
    pairs_first, pairs_second (P,) str
    pair_ids, pair_lengths, pair_type_ids    (P, T), (P,), (P, T) int32, as above
    pair_logits, pair_probs  (P, L) float32  ``predict(pairs)``, raw and soft-maxed
    pair_labels              (P,) str

``tasks/splade_<family>.npz``:

    texts                    (N,) str
    ids, lengths             (N, T), (N,) int32  truncated at max_seq_length 32
    dense                    (N, V) float32  ``SparseEncoder.encode(texts)``, made dense; 4 to 59
                                             non-zeros a row (``encode_query`` gives the same: these
                                             models have no query prompt; meta says so)

``tasks/quantize.npz`` (no model: ``sentence_transformers.quantize_embeddings`` on the unit
vectors ``st_default`` of ``families/roberta.npz``, D = 32):

    float                    (130, D) float32  the input
    binary, ubinary          (130, D/8) int8, uint8  of all 130 rows
    ranges                   (2, D) float32  the calibration set's min row and max row, rows 0-99
    int8, uint8              (130, D) int8, uint8    all 130 rows, ``calibration_embeddings`` =
                                                     rows 0-99 (the same as ``ranges=ranges``)

Each npz holds ``meta`` () str, JSON, also written beside it as ``tasks/<name>.json``: the
versions, the CPU, config.json and the other configuration files as saved, the activation and
where CrossEncoder read it from, max_length, the tokenizer's specials, post-processor and
model_input_names, the features sentence-transformers gives the model, the inputs' rows, every
tensor of model.safetensors with its shape, the head's tensors (those outside the base model,
and BERT's pooler), the weights transformers ties (not saved: the MLM decoders are the word
embeddings), the smallest gap between two scores of a query, the non-zeros of the SPLADE rows;
quantize.json quotes the lines of sentence-transformers' source that compute each precision.

The references are sensitive: each check computes the logits (SPLADE: the vectors) again with
one detail wrong and gives the largest absolute difference to the reference, which must be
above 1e-3 (this run):

    every model   truncated at 128 tokens instead of max_length 32       0.76 to 5.7
    bert          token type ids all 0 (the pairs)                       3.4 (rerank), 10.4 (classify)
    bert          no pooler (dense + tanh) before the classifier         12.2, 11.9
    roberta, xlm_roberta, mpnet   position ids from 0, not past the padding index   6.7, 6.6, 11.0
    modernbert    every layer global (no sliding window)                 3.0
    modernbert    classifier_pooling mean instead of cls                 13.7
    splade        sum pooling instead of max                             10.7, 8.3
    splade        padding positions not masked out                       0.83, 0.92

``rerank_qwen3`` is a Qwen3-Reranker (0.6B/4B/8B): a Qwen3ForCausalLM whose score is what its
model card computes, not a CrossEncoder's. The model: families/qwen3's sizes (hidden 32, 3
layers, 4 query heads of 12 on 2 key/value heads, intermediate 64, RoPE theta 100, RMSNorm eps
1e-6), max_position_embeddings 256, its LM head tied to the embeddings as Qwen3-Reranker-0.6B's
(model.safetensors holds no lm_head.weight), bos <|endoftext|>, eos <|im_end|>, no pad token id;
initialized as the others, then the final norm's weight set so that logit("yes") - logit("no")
of the 120 pairs has mean 0 and standard deviation 1.5 (``_calibrate_yes_no``). The tokenizer:
Qwen's byte-level BPE as families/qwen3's, trained again on the sentences, the template's text
and "yes" and "no" (single tokens, 358 and 310), with <|endoftext|> <|im_start|> <|im_end|>
(special) and <think> </think> (added) after its 700 entries, a ByteLevel post-processor that
appends nothing, <|endoftext|> the pad token, <|im_end|> eos, padding on the left,
model_max_length 128. Saved by transformers (``layout`` "transformers": config.json with
transformers 5's keys, generation_config.json, model.safetensors, the tokenizer's two files), no
sentence-transformers file. The scoring (``QWEN3_*``, also in meta's ``scoring``)::

    body = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"  # the instruction
           # "Given a web search query, retrieve relevant passages that answer the query" by default
    ids = prefix + tokenizer(body, truncation="longest_first", max_length=128 - 38 - 9) + suffix
    logits = model(left-padded batch).logits[:, -1, :]
    score = softmax([logits[no], logits[yes]])[1] = sigmoid(logits[yes] - logits[no])

with the system prompt's prefix (38 tokens) and the assistant's empty thinking as suffix (9), in
batches of one query's 24 documents; 32 of the 120 pairs are cut. ``tasks/rerank_qwen3.npz`` has
the rerankers' arrays, where ``logits`` is logit("yes") - logit("no") at the last token (the
``scores`` are its sigmoid, checked), ``pair_ids`` are the whole sequences (prefix, pair, suffix;
at most 128) laid out as the others' (0-padded on the right, though the tokenizer pads on the
left), ``pair_untruncated_lengths`` count prefix and suffix too, ``truncated`` says the formatted
pair was cut, ``pair_type_ids`` are zeros; and one more:

    scores_custom            (Q, D) float32  the scores with the instruction "Given a question, find
                                             the passage that answers it" (meta's custom_instruction)

Right-padded batches read at each row's last real token, one pair a batch, and
sentence-transformers' CrossEncoder for a causal LM (Transformer "text-generation", LogitScore)
on the same ids give the same logits but for rounding (below 1e-4). With one detail wrong (this
run): bidirectional attention 5.9, no q_norm/k_norm 4.0, RoPE theta 1000000 5.3, the final norm
without its weight 2.8, right-padded and read at the last column 5.2, the whole sequence cut at
128 (the suffix lost) 7.2, the formatted pair cut at 128 rather than 81 5.3.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sentence_transformers
import tokenizers
import torch
import transformers
from lib.reference_stack import (
    FAMILIES,
    FAMILIES_DIR,
    PAIR_ROWS,
    SENTENCES,
    SMALL,
    overwritten,
    patched,
    rewrite_json,
    tokenizer_meta,
)
from lib.references import cpu, padded
from safetensors import safe_open
from sentence_transformers import CrossEncoder, SparseEncoder, quantize_embeddings
from sentence_transformers.cross_encoder.modules import LogitScore
from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
from sentence_transformers.util import fullname, import_from_string, quantization
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import masking_utils
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX
from transformers.models.qwen3 import modeling_qwen3

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "data" / "tasks"

MAX_LENGTH = 32
LONG_LENGTH = 128  # what a reader that misses max_length 32 truncates at
QUERY_ROWS = (73, 22, 37, 121, 108)  # short: 8, 10, 12, 11 and 15 BERT tokens
DOCUMENT_ROWS = (5, 3, 26, 120, 129, 124, 0, 28, 98, 65, 18, 72, 88, 13, 36, 91, 128, 102, 104, 123, 125, 93, 59, 67)
TEXT_ROWS = tuple(range(0, 120, 4)) + tuple(range(120, 130))
CALIBRATION_ROWS = 100
SPLADE_BIAS_SHIFT = 3.0
LOGIT_STD = 1.5
ST5_VERSION = "4.1.0"  # the version a CrossEncoder saved by sentence-transformers 4 or 5 names
ST5_SPARSE_TYPES = {
    "MLMTransformer": "sentence_transformers.sparse_encoder.models.MLMTransformer",
    "SpladePooling": "sentence_transformers.sparse_encoder.models.SpladePooling",
}
IDENTITY = "torch.nn.modules.linear.Identity"
SENSITIVE = 1e-3
ROUNDING = 1e-4  # float32 over logits of a few units, summed in other orders
_BATCH = dict(truncation="longest_first", max_length=MAX_LENGTH, padding=True, return_tensors="pt")

# Qwen3-Reranker's scoring, as its model card publishes it
YES_NO_MAX_LENGTH = 128  # the prefix and suffix take 47 tokens, leaving 81 to the formatted pair
QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_TEMPLATE = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"
QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QWEN3_CUSTOM_INSTRUCTION = "Given a question, find the passage that answers it"
QWEN3_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN3_ADDED = ("<think>", "</think>")  # added tokens, not special ones, as in Qwen3's vocabulary
QWEN3_VOCAB_SIZE = 700  # before the five tokens above

_FAMILY_CONFIGS = {family.name: family.config for family in FAMILIES}
CONFIGS: dict[str, dict[str, Any]] = {
    "bert": _FAMILY_CONFIGS["bert_st6"],
    "distilbert": _FAMILY_CONFIGS["distilbert"],
    "roberta": _FAMILY_CONFIGS["roberta"],
    "xlm_roberta": {**_FAMILY_CONFIGS["xlm_roberta"], "hidden_size": SMALL["hidden_size"]},
    "mpnet": _FAMILY_CONFIGS["mpnet"],
    "modernbert": {**_FAMILY_CONFIGS["modernbert"], **SMALL},
    "qwen3": dict(  # families/qwen3's sizes, with an LM head tied to the embeddings
        model_type="qwen3",
        **{**SMALL, "num_hidden_layers": 3},
        num_key_value_heads=2,
        head_dim=12,
        rope_theta=100.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        hidden_act="silu",
        attention_bias=False,
        use_sliding_window=False,
        tie_word_embeddings=True,
    ),
}
TOKENIZER_FAMILY = {"bert": "bert_st6"}  # where a family's tokenizer is, if not families/<family>/


@dataclass(frozen=True)
class Task:
    name: str
    family: str
    kind: str  # "rerank", "classify" or "splade"
    layout: str = "st6"  # "st6", "st5" or "transformers": see the docstring
    labels: tuple[str, ...] = ("LABEL_0",)
    activation: str | None = None  # given to the CrossEncoder as it is made; None: its default
    weights_of: str | None = None  # made with that task's seed, so with its weights
    config: dict[str, Any] = field(default_factory=dict)  # over the family's
    scoring: str = "head"  # or "yes_no": a causal LM's logit("yes") - logit("no") at the last token


TASKS = (
    Task("rerank_bert", "bert", "rerank"),
    Task("rerank_bert_identity", "bert", "rerank", activation=IDENTITY, weights_of="rerank_bert"),
    Task("rerank_bert_identity_st5", "bert", "rerank", "st5", activation=IDENTITY, weights_of="rerank_bert"),
    Task("rerank_xlm_roberta", "xlm_roberta", "rerank", "transformers"),
    Task("rerank_roberta", "roberta", "rerank", "st5"),
    Task("rerank_distilbert", "distilbert", "rerank", "st5"),
    Task("rerank_mpnet", "mpnet", "rerank", "st5"),
    Task("rerank_modernbert", "modernbert", "rerank"),
    Task("rerank_qwen3", "qwen3", "rerank", "transformers", scoring="yes_no"),
    Task("classify_bert", "bert", "classify", labels=("negative", "neutral", "positive")),
    Task("classify_distilbert", "distilbert", "classify", "st5", labels=("NEGATIVE", "POSITIVE")),
    Task("splade_bert", "bert", "splade"),
    Task("splade_distilbert", "distilbert", "splade", "st5"),
)


def _model_class(task: Task) -> Any:
    if task.kind == "splade":
        return transformers.AutoModelForMaskedLM
    return transformers.AutoModelForSequenceClassification


def _tokenizer_dir(task: Task) -> Path:
    return FAMILIES_DIR / TOKENIZER_FAMILY.get(task.family, task.family)


def _calibrate(task: Task, model: Any, sentences: list[str]) -> None:
    """The output layer (``classifier`` or ``classifier.out_proj``) scaled and its bias set so that
    the logits of the reference inputs (the reranker's pairs, the classifier's texts) have mean 0
    and standard deviation ``LOGIT_STD`` for each label: scores spread out, far from ties and
    from the sigmoid's flat ends, and each of a classifier's labels the argmax of some texts. (A
    tokenizer of its own: one that has truncated saves its truncation in tokenizer_config.json.)"""
    tokenizer = transformers.AutoTokenizer.from_pretrained(_tokenizer_dir(task))
    if task.kind == "rerank":
        first = [sentences[q] for q in QUERY_ROWS for _ in DOCUMENT_ROWS]
        batch = tokenizer(first, [sentences[d] for _ in QUERY_ROWS for d in DOCUMENT_ROWS], **_BATCH)
    else:
        batch = tokenizer([sentences[i] for i in TEXT_ROWS], **_BATCH)
    logits = model(**batch).logits
    head = getattr(model.classifier, "out_proj", model.classifier)
    scale = LOGIT_STD / logits.std(0)
    head.weight.mul_(scale[:, None])
    head.bias.copy_((head.bias - logits.mean(0)) * scale)


def build(task: Task, sentences: list[str], out: Path) -> None:
    """Make the task's tiny random model and save it with sentence-transformers into ``out``."""
    torch.manual_seed(sum(map(ord, task.weights_of or task.name)))
    tokenizer = transformers.AutoTokenizer.from_pretrained(_tokenizer_dir(task))
    tokenizer.model_max_length = MAX_LENGTH
    ids = {}
    if task.family == "modernbert":
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        ids = dict(
            pad_token_id=tokenizer.pad_token_id, cls_token_id=cls, sep_token_id=sep, bos_token_id=cls, eos_token_id=sep
        )
    labels = {}
    if task.kind != "splade":
        id2label = dict(enumerate(task.labels))
        labels = dict(num_labels=len(task.labels), id2label=id2label, label2id={v: k for k, v in id2label.items()})
    config = transformers.AutoConfig.for_model(
        **{**CONFIGS[task.family], **task.config}, **ids, **labels, vocab_size=len(tokenizer), initializer_range=0.2
    )
    model = _model_class(task).from_config(config, attn_implementation="eager")
    with torch.no_grad():  # LayerNorm weights off 1, biases off 0: a reader that drops one is seen
        for parameter in model.parameters():
            if parameter.ndim == 1:
                parameter.add_(0.1 * torch.randn_like(parameter))
        if task.kind == "splade":  # most of the vocabulary below 0, so that the vectors are sparse
            model.get_output_embeddings().bias.sub_(SPLADE_BIAS_SHIFT)
        else:
            _calibrate(task, model.eval(), sentences)
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if task.kind == "splade" and task.layout == "st5":  # the module sentence-transformers 5 had
            modules = [MLMTransformer(tmp), SpladePooling("max", "relu")]
            SparseEncoder(modules=modules, device="cpu").save(str(out), create_model_card=False)
        elif task.kind == "splade":  # Transformer(transformer_task="fill-mask") and SpladePooling("max")
            SparseEncoder(tmp, device="cpu").save(str(out), create_model_card=False)
        else:
            activation = import_from_string(task.activation)() if task.activation else None
            encoder = CrossEncoder(tmp, max_length=MAX_LENGTH, activation_fn=activation, device="cpu")
            encoder.save(str(out), create_model_card=False)
    REWRITES[task.layout](task, out)


def _st5_cross_encoder(task: Task, out: Path) -> None:
    """A CrossEncoder as sentence-transformers 4 and 5 saved it: the activation in config.json."""
    activation = json.loads((out / "config_sentence_transformers.json").read_text())["activation_fn"]
    _transformers_only(task, out)
    section = ("sentence_transformers", {"activation_fn": activation, "version": ST5_VERSION})
    rewrite_json(out / "config.json", lambda config: dict(sorted([*config.items(), section])))


def _st5_sparse_encoder(task: Task, out: Path) -> None:
    """A SparseEncoder as sentence-transformers 5 saved it (and as the SPLADE models on the Hub are)."""
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]

    def old_types(modules: list[dict]) -> list[dict]:
        return [{**m, "type": ST5_SPARSE_TYPES[m["type"].rsplit(".", 1)[1]]} for m in modules]

    rewrite_json(out / "modules.json", old_types)
    rewrite_json(out / "sentence_bert_config.json", lambda _: {"max_seq_length": MAX_LENGTH, "do_lower_case": False})
    rewrite_json(out / "tokenizer_config.json", lambda config: {**config, "model_max_length": LONG_LENGTH})
    keys = ("pooling_strategy", "activation_function")
    pooling = out / "1_SpladePooling" / "config.json"
    rewrite_json(pooling, lambda c: {**{k: c[k] for k in keys}, "word_embedding_dimension": vocab})
    rewrite_json(out / "config_sentence_transformers.json", lambda c: {**c, "similarity_fn_name": "dot"})


def _transformers_only(task: Task, out: Path) -> None:
    for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        (out / name).unlink()


REWRITES: dict[str, Callable[[Task, Path], None]] = {
    "st6": lambda task, out: None,
    "st5": lambda task, out: (_st5_sparse_encoder if task.kind == "splade" else _st5_cross_encoder)(task, out),
    "transformers": _transformers_only,
}


def _by_hand(model: Any, inputs: list, **forward: Callable) -> np.ndarray:
    """``predict`` with Identity (the logits) or ``encode`` (the vectors) spelled out, in one batch,
    with ``forward``'s arguments (made from the features) given to the transformers model."""
    with torch.inference_mode():
        features = model[0].preprocess(inputs)
        features = model[0](features, **{key: make(features) for key, make in forward.items()})
        for module in list(model)[1:]:
            features = module(features)
    if "sentence_embedding" in features:
        return features["sentence_embedding"].numpy()
    scores = features["scores"].numpy()
    return scores[:, 0] if model.num_labels == 1 else scores


def _checks(task: Task, model: Any, pairs: bool) -> list[tuple[str, Any, dict[str, Callable]]]:
    """(what is wrong, a context that makes it so, arguments for the transformers model)."""
    auto = model[0].auto_model
    label = f"truncated at {LONG_LENGTH} tokens instead of max_length {MAX_LENGTH}"
    checks: list[tuple[str, Any, dict[str, Callable]]] = []
    checks.append((label, patched(model[0], "max_seq_length", LONG_LENGTH), {}))
    if pairs and "token_type_ids" in model[0].tokenizer.model_input_names:
        zeros = {"token_type_ids": lambda f: torch.zeros_like(f["token_type_ids"])}
        checks.append(("token type ids all 0", contextlib.nullcontext(), zeros))
    if task.family in ("roberta", "xlm_roberta", "mpnet"):
        from_zero = {"position_ids": lambda f: torch.arange(f["input_ids"].shape[1]).expand_as(f["input_ids"])}
        checks.append(("position ids from 0, not offset past the padding index", contextlib.nullcontext(), from_zero))
    if task.family == "modernbert":
        config = auto.config
        checks.append(("every layer global (no sliding window)", patched(config, "local_attention", 4096), {}))
        checks.append(("classifier_pooling mean instead of cls", patched(config, "classifier_pooling", "mean"), {}))
    if task.family == "bert" and task.kind != "splade":
        pooler = auto.bert.pooler.dense
        checks.append(("no pooler (dense + tanh) before the classifier", _identity_pooler(auto, pooler), {}))
    if task.kind == "splade":
        pooling = model[1]
        checks.append(("sum pooling instead of max", patched(pooling, "pooling_strategy", "sum"), {}))

        def unmasked(features: dict) -> dict:
            ones = torch.ones_like(features["attention_mask"])
            return SpladePooling.forward(pooling, {**features, "attention_mask": ones})

        checks.append(("padding positions not masked out", patched(pooling, "forward", unmasked), {}))
    return checks


@contextlib.contextmanager
def _identity_pooler(auto: Any, dense: torch.nn.Linear) -> Any:
    """BERT's pooler as if it were not there: the [CLS] vector straight to the classifier."""
    with (
        overwritten(dense.weight, torch.eye(dense.weight.shape[0])),
        overwritten(dense.bias, 0.0),
        patched(auto.bert.pooler, "activation", torch.nn.Identity()),
    ):
        yield


def sensitivity(task: Task, model: Any, inputs: list, reference: np.ndarray) -> dict[str, float]:
    same = float(np.abs(_by_hand(model, inputs) - reference).max())
    assert same < 1e-5, f"{task.name}: by hand differs from the reference by {same}"
    figures = {}
    pairs = isinstance(inputs[0], list | tuple)
    for label, context, forward in _checks(task, model, pairs):
        with context:
            figures[label] = round(float(np.abs(_by_hand(model, inputs, **forward) - reference).max()), 6)
        print(f"  {task.name:25s} {label:62s} max |difference| {figures[label]:.4f}")
        assert figures[label] > SENSITIVE, f"{task.name}: the references do not see {label!r}"
    return figures


def _pair_arrays(tokenizer: Any, first: list[str], second: list[str]) -> dict[str, np.ndarray]:
    pairs = [
        tokenizer(a, b, truncation="longest_first", max_length=MAX_LENGTH, return_token_type_ids=True)
        for a, b in zip(first, second, strict=True)
    ]
    ids, lengths = padded([p["input_ids"] for p in pairs])
    untruncated = [len(tokenizer(a, b)["input_ids"]) for a, b in zip(first, second, strict=True)]
    return {
        "pair_ids": ids,
        "pair_lengths": lengths,
        "pair_type_ids": padded([p["token_type_ids"] for p in pairs])[0],
        "pair_untruncated_lengths": np.asarray(untruncated, np.int32),
    }


def _check_features(model: Any, inputs: list, ids: np.ndarray, type_ids: np.ndarray | None) -> list[str]:
    """The ids sentence-transformers gives the model are ours; returns the features' names."""
    features = model[0].preprocess(inputs)
    mask = features["attention_mask"].numpy()
    np.testing.assert_array_equal(features["input_ids"].numpy() * mask, ids)
    if type_ids is not None and "token_type_ids" in features:
        np.testing.assert_array_equal(features["token_type_ids"].numpy() * mask, type_ids)
    return sorted(k for k, v in features.items() if isinstance(v, torch.Tensor))


def _predict(model: CrossEncoder, inputs: list, **kwargs: Any) -> np.ndarray:
    return np.asarray(model.predict(inputs, batch_size=32, show_progress_bar=False, **kwargs), np.float32)


def rerank_references(task: Task, model: CrossEncoder, tokenizer: Any, sentences: list[str]) -> tuple[dict, dict]:
    queries = [sentences[i] for i in QUERY_ROWS]
    documents = [sentences[i] for i in DOCUMENT_ROWS]
    arrays: dict[str, np.ndarray] = {
        "queries": np.asarray(queries, dtype=np.str_),
        "documents": np.asarray(documents, dtype=np.str_),
    }
    identity = torch.nn.Identity()
    arrays["scores"] = np.stack([_predict(model, [(q, d) for d in documents]) for q in queries])
    arrays["logits"] = np.stack([_predict(model, [(q, d) for d in documents], activation_fn=identity) for q in queries])
    arrays["rank"] = np.argsort(-arrays["scores"], axis=1, kind="stable").astype(np.int32)
    for q, query in enumerate(queries):
        ranked = [hit["corpus_id"] for hit in model.rank(query, documents, show_progress_bar=False)]
        assert ranked == arrays["rank"][q].tolist(), f"{task.name}: CrossEncoder.rank disagrees with the scores"
    first = [q for q in queries for _ in documents]
    second = [d for _ in queries for d in documents]
    arrays.update(_pair_arrays(tokenizer, first, second))
    truncated = arrays["pair_untruncated_lengths"] > MAX_LENGTH
    assert (arrays["pair_lengths"][truncated] == MAX_LENGTH).all()
    assert (arrays["pair_lengths"][~truncated] == arrays["pair_untruncated_lengths"][~truncated]).all()
    arrays["truncated"] = truncated.reshape(len(queries), len(documents)).astype(np.int32)
    gaps = np.diff(np.sort(arrays["scores"], axis=1), axis=1)
    pairs = [[a, b] for a, b in zip(first, second, strict=True)]
    feature_names = _check_features(model, pairs, arrays["pair_ids"], arrays["pair_type_ids"])
    meta = {
        "query_rows": QUERY_ROWS,
        "document_rows": DOCUMENT_ROWS,
        "truncated_pairs": int(truncated.sum()),
        "smallest_gap_between_scores_of_a_query": float(gaps.min()),
        "features": feature_names,
        "sensitivity": sensitivity(task, model, pairs, arrays["logits"].reshape(-1)),
    }
    return arrays, meta


def classify_references(task: Task, model: CrossEncoder, tokenizer: Any, sentences: list[str]) -> tuple[dict, dict]:
    texts = [sentences[i] for i in TEXT_ROWS]
    first = [sentences[a] for a, _ in PAIR_ROWS]
    second = [sentences[b] for _, b in PAIR_ROWS]
    id2label = model.config.id2label
    identity = torch.nn.Identity()
    arrays: dict[str, np.ndarray] = {"texts": np.asarray(texts, dtype=np.str_)}
    arrays["ids"], arrays["lengths"] = padded([tokenizer(t, truncation=True)["input_ids"] for t in texts])
    # predict() takes a list of strings for one pair: each text is one call
    arrays["logits"] = np.stack([_predict(model, t, activation_fn=identity) for t in texts])
    arrays["probs"] = np.stack([_predict(model, t, activation_fn=identity, apply_softmax=True) for t in texts])
    arrays["labels"] = np.asarray([id2label[int(i)] for i in arrays["logits"].argmax(1)], dtype=np.str_)
    arrays["pairs_first"] = np.asarray(first, dtype=np.str_)
    arrays["pairs_second"] = np.asarray(second, dtype=np.str_)
    arrays.update(_pair_arrays(tokenizer, first, second))
    del arrays["pair_untruncated_lengths"]
    pairs = [[a, b] for a, b in zip(first, second, strict=True)]
    arrays["pair_logits"] = _predict(model, pairs, activation_fn=identity)
    arrays["pair_probs"] = _predict(model, pairs, activation_fn=identity, apply_softmax=True)
    arrays["pair_labels"] = np.asarray([id2label[int(i)] for i in arrays["pair_logits"].argmax(1)], dtype=np.str_)
    softmax = np.exp(arrays["logits"] - arrays["logits"].max(1, keepdims=True))
    np.testing.assert_allclose(arrays["probs"], softmax / softmax.sum(1, keepdims=True), atol=1e-6)
    np.testing.assert_allclose(_by_hand(model, texts), arrays["logits"], atol=1e-5)
    _check_features(model, texts, arrays["ids"], None)
    meta = {
        "text_rows": TEXT_ROWS,
        "pair_rows": PAIR_ROWS,
        "features": _check_features(model, pairs, arrays["pair_ids"], arrays["pair_type_ids"]),
        "label_counts": {label: int((arrays["labels"] == label).sum()) for label in id2label.values()},
        "sensitivity": sensitivity(task, model, pairs, arrays["pair_logits"]),
    }
    return arrays, meta


def splade_references(task: Task, model: SparseEncoder, tokenizer: Any, sentences: list[str]) -> tuple[dict, dict]:
    texts = [sentences[i] for i in TEXT_ROWS]
    assert model.max_seq_length == MAX_LENGTH, model.max_seq_length
    arrays: dict[str, np.ndarray] = {"texts": np.asarray(texts, dtype=np.str_)}
    arrays["ids"], arrays["lengths"] = padded(
        [tokenizer(t, truncation=True, max_length=MAX_LENGTH)["input_ids"] for t in texts]
    )
    with torch.inference_mode():
        arrays["dense"] = model.encode(texts, show_progress_bar=False).to_dense().numpy().astype(np.float32)
        query = model.encode_query(texts, show_progress_bar=False).to_dense().numpy().astype(np.float32)
    query_differs = not np.array_equal(query, arrays["dense"])
    if query_differs:
        arrays["query_dense"] = query
    nonzeros = (arrays["dense"] > 0).sum(1)
    assert (arrays["dense"] >= 0).all()
    meta = {
        "text_rows": TEXT_ROWS,
        "features": _check_features(model, texts, arrays["ids"], None),
        "encode_query_differs": query_differs,
        "nonzeros_per_row": dict(min=int(nonzeros.min()), median=float(np.median(nonzeros)), max=int(nonzeros.max())),
        "smallest_nonzero": float(arrays["dense"][arrays["dense"] > 0].min()),
        "splade_bias_shift": SPLADE_BIAS_SHIFT,
        "sensitivity": sensitivity(task, model, texts, arrays["dense"]),
    }
    return arrays, meta


def _tensors(out: Path, model: Any) -> dict[str, Any]:
    """The tensors of model.safetensors, those of the head (outside the base model, and BERT's
    pooler), and the weights transformers ties (saved once, under the name they are tied to)."""
    with safe_open(str(out / "model.safetensors"), "np") as f:
        shapes = {name: list(f.get_slice(name).get_shape()) for name in sorted(f.keys())}
    auto = model[0].auto_model
    prefix = auto.base_model_prefix + "."
    tied = dict(type(auto)._tied_weights_keys or {})
    return {
        "tensors": shapes,
        "head_tensors": {n: shape for n, shape in shapes.items() if not n.startswith(prefix) or ".pooler." in n},
        "base_model_prefix": auto.base_model_prefix,
        "tied_weights": tied,
        "tied_weights_stored": {name: name in shapes for name in tied},
    }


def _activation_from(out: Path) -> str:
    """Where CrossEncoder took its activation from (sentence-transformers 6.3's order)."""
    configs = _configs(out)
    if "activation_fn" in configs.get("config_sentence_transformers.json", {}):
        return "config_sentence_transformers.json: activation_fn"
    config = json.loads((out / "config.json").read_text())
    if "activation_fn" in config.get("sentence_transformers", {}):
        return 'config.json: "sentence_transformers": {"activation_fn": ...}'
    if config.get("sbert_ce_default_activation_function"):
        return "config.json: sbert_ce_default_activation_function"
    return "none saved: the default, Sigmoid for num_labels 1, else Identity"


def _configs(out: Path) -> dict[str, Any]:
    names = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
    names += ("1_SpladePooling/config.json",)
    return {name: json.loads((out / name).read_text()) for name in names if (out / name).exists()}


REFERENCES = {"rerank": rerank_references, "classify": classify_references, "splade": splade_references}


def references(task: Task, out: Path, sentences: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    model: Any = (SparseEncoder if task.kind == "splade" else CrossEncoder)(str(out), device="cpu")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    saved_tokenizer = tokenizer_meta(out, tokenizer)  # its model_max_length as saved
    tokenizer.model_max_length = model.max_seq_length
    arrays, meta = REFERENCES[task.kind](task, model, tokenizer, sentences)
    head = {
        "name": task.name,
        "kind": task.kind,
        "family": task.family,
        "tokenizer_from": str(_tokenizer_dir(task).relative_to(ROOT)),
        "layout": task.layout,
        "config": json.loads((out / "config.json").read_text()),
        **_configs(out),
        "max_length": model.max_seq_length,
        "tokenizer": saved_tokenizer,
        **_tensors(out, model),
    }
    if task.kind != "splade":
        head["activation_fn"] = fullname(model.activation_fn)
        head["activation_from"] = _activation_from(out)
        head["num_labels"] = model.num_labels
    return arrays, {**head, **meta}


def _qwen3_tokenizer(sentences: list[str]) -> transformers.Qwen2Tokenizer:
    """Qwen's byte-level BPE as Qwen3-Reranker has it (families/qwen3's, trained again): NFC, Qwen's
    split, <|endoftext|> <|im_start|> <|im_end|> (special) then <think> </think> (added, not
    special) after the vocabulary, nothing appended (a ByteLevel post-processor, as Qwen3's
    tokenizer.json has), <|endoftext|> the pad token, <|im_end|> the eos token, padding on the
    left. Trained on the sentences, on the template's text (its words whole, as in Qwen's
    vocabulary: 47 tokens around each pair, not a hundred) and on "yes" and "no" alone, which the
    scoring reads as single tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    split = pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    trainer = trainers.BpeTrainer(vocab_size=QWEN3_VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    template = [QWEN3_PREFIX, QWEN3_SUFFIX]
    template += [
        QWEN3_TEMPLATE.format(instruction=i, query="", doc="") for i in (QWEN3_INSTRUCTION, QWEN3_CUSTOM_INSTRUCTION)
    ]
    specials = re.compile("|".join(map(re.escape, QWEN3_SPECIALS + QWEN3_ADDED)))  # not learnt as merges
    pieces = [piece for text in template for piece in specials.split(text) if piece]
    tokenizer.train_from_iterator(sentences + pieces * 10 + ["yes", "no"] * 10, trainer)
    model = json.loads(tokenizer.to_str())["model"]
    qwen = transformers.Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=[tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]],
        unk_token=None,
        eos_token=QWEN3_SPECIALS[0],  # <|endoftext|> first among the added tokens, then the chat's two
        pad_token=QWEN3_SPECIALS[0],
        extra_special_tokens=list(QWEN3_SPECIALS[1:]),
        padding_side="left",
    )
    qwen.eos_token = "<|im_end|>"
    qwen.add_tokens([AddedToken(t, normalized=False, special=False) for t in QWEN3_ADDED])
    qwen.backend_tokenizer.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    return qwen


def _yes_no_ids(tokenizer: Any) -> tuple[int, int]:
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    assert isinstance(yes, int) and isinstance(no, int), "'yes' and 'no' are not tokens"
    return yes, no


def _yes_no_rows(
    tokenizer: Any, queries: list[str], documents: list[str], instruction: str
) -> tuple[list[list[int]], list[list[int]]]:
    """Every (query, document) pair, row-major, as the model card makes its ids: formatted,
    tokenized alone with no special tokens, truncated at max_length less the prefix's and
    suffix's tokens, between those; and the same uncut."""
    prefix = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)
    bodies = [QWEN3_TEMPLATE.format(instruction=instruction, query=q, doc=d) for q in queries for d in documents]
    limit = YES_NO_MAX_LENGTH - len(prefix) - len(suffix)
    cut = tokenizer(bodies, padding=False, truncation="longest_first", return_attention_mask=False, max_length=limit)
    whole = tokenizer(bodies, return_attention_mask=False)
    return [prefix + ids + suffix for ids in cut["input_ids"]], [prefix + ids + suffix for ids in whole["input_ids"]]


def _model_card_scores(model: Any, tokenizer: Any, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """The model card's scores of one left-padded batch, and logit("yes") - logit("no") at its last
    position. (The card also gives ``pad`` max_length, which does nothing with padding=True.)"""
    inputs = tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt")
    with torch.inference_mode():
        logits = model(**inputs).logits[:, -1, :]
    yes, no = _yes_no_ids(tokenizer)
    scores = torch.nn.functional.log_softmax(torch.stack([logits[:, no], logits[:, yes]], dim=1), dim=1)[:, 1].exp()
    return scores.numpy(), (logits[:, yes] - logits[:, no]).numpy()


def _yes_no_logits(
    model: Any, tokenizer: Any, rows: list[list[int]], side: str = "left", batch: int = 0, last_column: bool = False
) -> np.ndarray:
    """logit("yes") - logit("no") of the rows in batches of ``batch`` (one query's documents by
    default), padded on ``side``, read at each row's last real token (or at the batch's last
    column, a padding position for a short right-padded row, if ``last_column``)."""
    batch = batch or len(DOCUMENT_ROWS)
    yes, no = _yes_no_ids(tokenizer)
    out = []
    with patched(tokenizer, "padding_side", side), torch.inference_mode():
        for start in range(0, len(rows), batch):
            inputs = tokenizer.pad({"input_ids": rows[start : start + batch]}, padding=True, return_tensors="pt")
            mask = inputs["attention_mask"]
            last = mask.sum(1) - 1 if side == "right" and not last_column else torch.full_like(mask[:, 0], -1)
            logits = model(**inputs).logits[torch.arange(len(mask)), last]
            out.append((logits[:, yes] - logits[:, no]).numpy())
    return np.concatenate(out)


def _calibrate_yes_no(model: Any, tokenizer: Any, sentences: list[str]) -> None:
    """The final norm's weight w moved so that logit("yes") - logit("no") of the reference pairs
    has mean 0 and standard deviation ``LOGIT_STD``. That difference is linear in w, the sum over
    k of (E_yes - E_no)_k w_k n_k (E the tied embeddings, n the last token's vector normalized
    before its weight): w loses its part along the pairs' mean of (E_yes - E_no) * n, which sets
    the mean to 0, and is scaled. The norm feeds only the LM head, so the embeddings, "yes" and
    "no" among them (the prefix holds both), and every hidden state stay as they were."""
    rows = _yes_no_rows(
        tokenizer, [sentences[i] for i in QUERY_ROWS], [sentences[i] for i in DOCUMENT_ROWS], QWEN3_INSTRUCTION
    )[0]
    inputs = tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt")
    normed = model(**inputs, output_hidden_states=True).hidden_states[-1][:, -1]  # after the final norm
    weight = model.model.norm.weight
    yes, no = _yes_no_ids(tokenizer)
    embeddings = model.get_input_embeddings().weight
    terms = (embeddings[yes] - embeddings[no]) * normed / weight
    mean = terms.mean(0)
    centred = weight - (mean @ weight) / (mean @ mean) * mean
    weight.copy_(centred * LOGIT_STD / (terms @ centred).std())
    logits = _yes_no_logits(model, tokenizer, rows)
    assert abs(logits.mean()) < 1e-3 and abs(logits.std(ddof=1) - LOGIT_STD) < 1e-3, (logits.mean(), logits.std())


def build_yes_no(task: Task, sentences: list[str], out: Path) -> None:
    """Make the tiny random Qwen3-Reranker and save it as transformers does: config.json,
    generation_config.json, model.safetensors and the tokenizer's two files (Qwen3-Reranker ships
    no sentence-transformers files)."""
    torch.manual_seed(sum(map(ord, task.name)))
    tokenizer = _qwen3_tokenizer(sentences)
    tokenizer.model_max_length = YES_NO_MAX_LENGTH
    # as Qwen3-Reranker's config: bos <|endoftext|>, eos <|im_end|>, no pad token id
    ends = dict(bos_token_id=tokenizer.convert_tokens_to_ids(QWEN3_SPECIALS[0]), eos_token_id=tokenizer.eos_token_id)
    config = transformers.AutoConfig.for_model(
        **{**CONFIGS[task.family], **task.config}, **ends, vocab_size=len(tokenizer), initializer_range=0.2
    )
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():  # RMSNorm weights off 1: a reader that drops one is seen
        for parameter in model.parameters():
            if parameter.ndim == 1:
                parameter.add_(0.1 * torch.randn_like(parameter))
        _calibrate_yes_no(model.eval(), tokenizer, sentences)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def _yes_no_checks(model: Any, tokenizer: Any, whole: list[list[int]]) -> list[tuple[str, Any, dict]]:
    """(what is wrong, a context that makes it so, arguments for ``_yes_no_logits``); ``whole``
    the rows uncut."""
    auto = model.model
    bidirectional, no_qk_norm = contextlib.ExitStack(), contextlib.ExitStack()
    bidirectional.enter_context(patched(modeling_qwen3, "create_causal_mask", masking_utils.create_bidirectional_mask))
    for layer in auto.layers:
        bidirectional.enter_context(patched(layer.self_attn, "is_causal", False))
        no_qk_norm.enter_context(patched(layer.self_attn, "q_norm", torch.nn.Identity()))
        no_qk_norm.enter_context(patched(layer.self_attn, "k_norm", torch.nn.Identity()))
    halves = torch.arange(0, auto.config.head_dim, 2, dtype=torch.float) / auto.config.head_dim
    real_theta = overwritten(auto.rotary_emb.inv_freq, 1.0 / 1_000_000.0**halves)
    prefix = len(tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False))
    suffix = len(tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False))
    pair_cut = [r[:prefix] + r[prefix:-suffix][:YES_NO_MAX_LENGTH] + r[-suffix:] for r in whole]
    cut = [r[:YES_NO_MAX_LENGTH] for r in whole]
    none = contextlib.nullcontext()
    limit = YES_NO_MAX_LENGTH - prefix - suffix
    return [
        ("bidirectional attention, not causal", bidirectional, {}),
        ("no q_norm/k_norm", no_qk_norm, {}),
        ("RoPE theta 1000000 (Qwen3-Reranker's), not 100", real_theta, {}),
        ("the final norm without its weight", overwritten(auto.norm.weight, 1.0), {}),
        ("right-padded, read at the last column", none, dict(side="right", last_column=True)),
        (f"the whole sequence truncated at {YES_NO_MAX_LENGTH} (the suffix cut off)", none, dict(rows=cut)),
        (f"the formatted pair truncated at {YES_NO_MAX_LENGTH}, not {limit}", none, dict(rows=pair_cut)),
    ]


def _through_cross_encoder(out: Path, tokenizer: Any, rows: list[list[int]]) -> np.ndarray:
    """sentence-transformers 6.3's CrossEncoder for a causal LM (Transformer "text-generation",
    then LogitScore with "yes" and "no") on left-padded batches of the rows."""
    encoder = CrossEncoder(str(out), device="cpu")
    score = encoder[1]
    assert isinstance(score, LogitScore) and (score.true_token_id, score.false_token_id) == _yes_no_ids(tokenizer)
    logits = []
    with torch.inference_mode():
        for start in range(0, len(rows), len(DOCUMENT_ROWS)):
            batch = rows[start : start + len(DOCUMENT_ROWS)]
            features = dict(tokenizer.pad({"input_ids": batch}, padding=True, return_tensors="pt"))
            logits.append(score(encoder[0](features))["scores"][:, 0].numpy())
    return np.concatenate(logits)


def _yes_no_sensitivity(
    task: Task,
    out: Path,
    model: Any,
    tokenizer: Any,
    rows: list[list[int]],
    whole: list[list[int]],
    reference: np.ndarray,
) -> tuple[dict[str, float], dict[str, float]]:
    """The logits again with one detail wrong (each must differ), and computed other ways that
    must give the same but for rounding: right-padded batches read at each row's last real token
    (transformers' Qwen3 gives a left-padded row positions that start after its padding, RoPE sees
    only their differences), one pair a batch (no padding), and sentence-transformers'
    CrossEncoder on the same ids."""
    same = {
        "right-padded, read at each row's last real token": _yes_no_logits(model, tokenizer, rows, side="right"),
        "one pair a batch (no padding)": _yes_no_logits(model, tokenizer, rows, batch=1),
        "sentence-transformers' CrossEncoder with LogitScore": _through_cross_encoder(out, tokenizer, rows),
    }
    rounding = {}
    for label, logits in same.items():
        rounding[label] = float(np.abs(logits - reference).max())
        print(f"  {task.name:25s} {label:62s} max |difference| {rounding[label]:.2e}")
        assert rounding[label] < ROUNDING, f"{task.name}: {label} gives other logits"
    figures = {}
    for label, context, arguments in _yes_no_checks(model, tokenizer, whole):
        with context:
            logits = _yes_no_logits(model, tokenizer, **{"rows": rows, **arguments})
        figures[label] = round(float(np.abs(logits - reference).max()), 6)
        print(f"  {task.name:25s} {label:62s} max |difference| {figures[label]:.4f}")
        assert figures[label] > SENSITIVE, f"{task.name}: the references do not see {label!r}"
    return figures, rounding


def yes_no_references(task: Task, out: Path, sentences: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The model card's scores of the pairs (and with the custom instruction), the logits under
    them, and the pairs' ids laid out as the other rerankers' (right-aligned, 0-padded)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.padding_side == "left" and tokenizer.model_max_length == YES_NO_MAX_LENGTH
    queries = [sentences[i] for i in QUERY_ROWS]
    documents = [sentences[i] for i in DOCUMENT_ROWS]
    shape = (len(queries), len(documents))
    rows, whole = _yes_no_rows(tokenizer, queries, documents, QWEN3_INSTRUCTION)
    custom_rows = _yes_no_rows(tokenizer, queries, documents, QWEN3_CUSTOM_INSTRUCTION)[0]
    by_query = [slice(q * len(documents), (q + 1) * len(documents)) for q in range(len(queries))]
    scores, logits = zip(*(_model_card_scores(model, tokenizer, rows[q]) for q in by_query), strict=True)
    scores_custom = [_model_card_scores(model, tokenizer, custom_rows[q])[0] for q in by_query]
    arrays: dict[str, np.ndarray] = {
        "queries": np.asarray(queries, dtype=np.str_),
        "documents": np.asarray(documents, dtype=np.str_),
        "scores": np.stack(scores),
        "logits": np.stack(logits),
        "scores_custom": np.stack(scores_custom),
    }
    np.testing.assert_allclose(1 / (1 + np.exp(-arrays["logits"])), arrays["scores"], atol=1e-6, rtol=0)
    arrays["rank"] = np.argsort(-arrays["scores"], axis=1, kind="stable").astype(np.int32)
    arrays["pair_ids"], arrays["pair_lengths"] = padded(rows)
    arrays["pair_type_ids"] = np.zeros_like(arrays["pair_ids"])
    arrays["pair_untruncated_lengths"] = np.asarray([len(r) for r in whole], np.int32)
    truncated = arrays["pair_untruncated_lengths"] > YES_NO_MAX_LENGTH
    assert (arrays["pair_lengths"][truncated] == YES_NO_MAX_LENGTH).all()
    assert (arrays["pair_lengths"][~truncated] == arrays["pair_untruncated_lengths"][~truncated]).all()
    arrays["truncated"] = truncated.reshape(shape).astype(np.int32)
    prefix = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)
    yes, no = _yes_no_ids(tokenizer)
    sensitivity, rounding = _yes_no_sensitivity(task, out, model, tokenizer, rows, whole, arrays["logits"].reshape(-1))
    with safe_open(str(out / "model.safetensors"), "np") as f:
        tensors = {name: list(f.get_slice(name).get_shape()) for name in sorted(f.keys())}
    gaps = np.diff(np.sort(arrays["scores"], axis=1), axis=1)
    meta = {
        "name": task.name,
        "kind": task.kind,
        "family": task.family,
        "tokenizer_from": "trained here as families/qwen3's, on the sentences and the template's text",
        "layout": task.layout,
        "files": sorted(p.name for p in out.iterdir()),
        "config": json.loads((out / "config.json").read_text()),
        "generation_config": json.loads((out / "generation_config.json").read_text()),
        "max_length": YES_NO_MAX_LENGTH,
        "tokenizer": {**tokenizer_meta(out, tokenizer), "padding_side": tokenizer.padding_side},
        "added_tokens": {
            t: [tokenizer.convert_tokens_to_ids(t), t in tokenizer.all_special_tokens]
            for t in QWEN3_SPECIALS + QWEN3_ADDED
        },
        "tensors": tensors,
        "tied_weights": dict(type(model)._tied_weights_keys or {}),
        "tied_weights_stored": {name: name in tensors for name in type(model)._tied_weights_keys or {}},
        "scoring": {
            "prefix": QWEN3_PREFIX,
            "suffix": QWEN3_SUFFIX,
            "template": QWEN3_TEMPLATE,
            "instruction": QWEN3_INSTRUCTION,
            "custom_instruction": QWEN3_CUSTOM_INSTRUCTION,
            "prefix_ids": prefix,
            "suffix_ids": suffix,
            "pair_max_length": YES_NO_MAX_LENGTH - len(prefix) - len(suffix),
            "yes_id": yes,
            "no_id": no,
            "logits": 'logit("yes") - logit("no") at the last position of a left-padded batch',
            "scores": 'exp(log_softmax([logit("no"), logit("yes")])[1]) = sigmoid(logits)',
            "batches": "one query's documents a batch",
        },
        "query_rows": QUERY_ROWS,
        "document_rows": DOCUMENT_ROWS,
        "truncated_pairs": int(truncated.sum()),
        "logits_mean": float(arrays["logits"].mean()),
        "logits_std": float(arrays["logits"].std(ddof=1)),
        "smallest_gap_between_scores_of_a_query": float(gaps.min()),
        "custom_instruction_max_score_difference": float(np.abs(arrays["scores_custom"] - arrays["scores"]).max()),
        "same_but_for_rounding": rounding,
        "sensitivity": sensitivity,
    }
    return arrays, meta


def _quoted(function: Callable, *needles: str) -> list[str]:
    """The lines of ``function``'s source that hold one of ``needles``, stripped."""
    return [line.strip() for line in inspect.getsource(function).splitlines() if any(n in line for n in needles)]


def quantize_references(sentences: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    source = np.load(FAMILIES_DIR / "roberta.npz")
    vectors = source["st_default"].astype(np.float32)
    assert len(vectors) == len(sentences)
    calibration = vectors[:CALIBRATION_ROWS]
    arrays: dict[str, np.ndarray] = {"float": vectors}
    arrays["binary"] = quantize_embeddings(vectors, precision="binary")
    arrays["ubinary"] = quantize_embeddings(vectors, precision="ubinary")
    arrays["ranges"] = np.vstack((calibration.min(0), calibration.max(0))).astype(np.float32)
    for precision in ("int8", "uint8"):
        arrays[precision] = quantize_embeddings(vectors, precision=precision, calibration_embeddings=calibration)
        same = quantize_embeddings(vectors, precision=precision, ranges=arrays["ranges"])
        np.testing.assert_array_equal(same, arrays[precision])
    # the formulas below, by hand, give the same bytes
    packed = np.packbits(vectors > 0, axis=-1)
    np.testing.assert_array_equal(arrays["ubinary"], packed)
    np.testing.assert_array_equal(arrays["binary"], (packed.astype(np.int16) - 128).astype(np.int8))
    starts = arrays["ranges"][0]
    steps = (arrays["ranges"][1] - starts) / 255
    buckets = np.clip(np.floor((vectors - starts) / np.where(steps == 0, 1, steps)), 0, 255)
    np.testing.assert_array_equal(arrays["uint8"], buckets.astype(np.uint8))
    np.testing.assert_array_equal(arrays["int8"], (buckets - 128).astype(np.int8))
    meta = {
        "source": "families/roberta.npz st_default (unit vectors of the 130 sentences)",
        "calibration_rows": f"0-{CALIBRATION_ROWS - 1}",
        "function": f"{quantize_embeddings.__module__}.quantize_embeddings",
        "dtypes": {key: str(value.dtype) for key, value in arrays.items()},
        "formulas": {
            "ranges": _quoted(quantization._get_quantization_ranges, "np.vstack"),
            "int8_uint8": _quoted(quantize_embeddings, "ranges.astype", "starts =", "steps", "q_vals"),
            "binary": _quoted(quantize_embeddings, "np.packbits"),
        },
        "notes": [
            "ranges, starts, steps and the division are float32; floor, then clip to [0, 255]",
            "binary: np.packbits (bits big-endian within a byte: dimension 8k is the byte's 0x80 bit) of x > 0, "
            "minus 128 as int8 (0 -> -128, 255 -> 127); ubinary: the same bytes as uint8",
        ],
    }
    return arrays, meta


def _write(out_dir: Path, name: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    versions = {lib.__name__: lib.__version__ for lib in (sentence_transformers, transformers, torch, tokenizers)}
    meta.update(versions, numpy=np.__version__, cpu=cpu()[0], cpu_flags=cpu()[1], torch_threads=torch.get_num_threads())
    arrays["meta"] = np.asarray(json.dumps(meta, ensure_ascii=False))
    for key, value in arrays.items():
        assert value.dtype not in (np.float64, np.int64, np.bool_), key
    np.savez_compressed(out_dir / f"{name}.npz", **arrays)
    (out_dir / f"{name}.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    shapes = ", ".join(f"{k} {tuple(v.shape)} {v.dtype}" for k, v in arrays.items() if k != "meta")
    print(f"wrote {name}.npz: {shapes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument("--only", choices=[t.name for t in TASKS] + ["quantize"], action="append")
    args = parser.parse_args()
    sentences = json.loads(SENTENCES.read_text(encoding="utf-8"))
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for task in TASKS:
        if args.only and task.name not in args.only:
            continue
        out = args.out_dir / task.name
        if task.scoring == "yes_no":
            build_yes_no(task, sentences, out)
            arrays, meta = yes_no_references(task, out, sentences)
        else:
            build(task, sentences, out)
            arrays, meta = references(task, out, sentences)
        if task.weights_of and (args.out_dir / f"{task.weights_of}.npz").exists():
            same = np.load(args.out_dir / f"{task.weights_of}.npz")["logits"]
            np.testing.assert_allclose(arrays["scores"], same, atol=1e-6, err_msg=f"{task.name}: not raw logits")
        _write(args.out_dir, task.name, arrays, meta)
    if not args.only or "quantize" in args.only:
        _write(args.out_dir, "quantize", *quantize_references(sentences))


if __name__ == "__main__":
    main()
