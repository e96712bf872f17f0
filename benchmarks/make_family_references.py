"""Build ``tests/data/families/``: a tiny random model of each family (the encoders, and the
Qwen3 decoder of Qwen3-Embedding), made and saved by the reference stack (transformers +
sentence-transformers 6), with what that stack computes for it, for the tests to compare
bertserve with.

Needs torch, transformers, sentence-transformers, tokenizers and sentencepiece (only for the
normalization table XLM-R's tokenizer carries); no network, no downloaded weights::

    python benchmarks/make_family_references.py                 # every family
    python benchmarks/make_family_references.py --only roberta   # one family
    python benchmarks/make_family_references.py --code CODE --only gte --only nomic_bert --only jina_bert

The BERT variants that ship their own model code (GTE's "new" model, NomicBERT, JinaBERT) are
made and run by that code, which ``--code`` holds (:mod:`lib.variant_models` says what each
tiny model is and where its code comes from).

Each model is randomly initialized (seeded, ``initializer_range`` 0.2, every 1-d weight and
bias moved off its 1/0 start) so that its vectors are far from trivial. Its tokenizer is trained
with the ``tokenizers`` library on ``tests/data/sentences.json`` and laid out as the family's
own: the model of that kind, its special tokens at their usual ids, its pre-tokenizer and
post-processor. Each lands in ``families/<name>/`` as ``SentenceTransformer.save`` writes it
(no model card), then:

    distilbert   DistilBERT, WordPiece uncased; mean pooling, Dense 32 -> 24 (tanh), Normalize
    roberta      RoBERTa, byte-level BPE (``<s> A </s></s> B </s>``); mean, Normalize
    xlm_roberta  XLM-RoBERTa, SentencePiece Unigram (a small Precompiled normalizer, Metaspace);
                 hidden 48, one token type; mean, Normalize
    mpnet        MPNet, WordPiece with ``<s>``/``</s>``, 32 relative-position buckets; mean, Normalize
    modernbert   ModernBERT, byte-level BPE with [CLS]/[SEP]; 4 layers (global, local, local,
                 global), local window 8 (|i - j| <= 4), RoPE theta 160000 global / 100 local
                 (the real 10000 barely turns over a window of 4);
                 CLS pooling, Normalize
    bert_st6     BERT, WordPiece uncased; weighted-mean pooling, as sentence-transformers 6 saves
                 it: ``"pooling_mode"`` in 1_Pooling/config.json, no ``max_seq_length`` in
                 sentence_bert_config.json (the limit is the tokenizer's ``model_max_length``, 40)
    qwen3        Qwen3 as Qwen3-Embedding loads it (``AutoModel``: causal attention, no LM head);
                 byte-level BPE with Qwen's split and specials (``A <|endoftext|>`` and
                 ``A <|endoftext|> B <|endoftext|>``, ``<|endoftext|>`` also the pad token, padding
                 on the left); 3 layers, 4 query heads of 12 on 2 key/value heads (q_proj 32 -> 48),
                 q_norm/k_norm, RoPE theta 100 (the real 1000000 barely turns over 32 positions);
                 last-token pooling, Normalize; Qwen3-Embedding's prompts (``query`` an instruction,
                 ``document`` empty, no default)
    gemma3       Gemma 3 as EmbeddingGemma loads it (``Gemma3TextModel`` with
                 ``use_bidirectional_attention``); Gemma's SentencePiece BPE (spaces made "▁", byte
                 fallback, <pad> <eos> <bos> <unk> <mask> at ids 0 to 4, ``<bos> A <eos>`` and
                 ``<bos> A <eos> <bos> B <eos>``, padding on the right; the emoji U+1F642 kept out of
                 the vocabulary, so that it falls back to its 4 bytes); 4 layers (sliding, sliding,
                 sliding, full), 4 query heads of 12 on 2 key/value heads (q_proj 32 -> 48),
                 q_norm/k_norm, query_pre_attn_scalar 16 (not head_dim), sliding window 8, RoPE
                 theta 100 full / 10 sliding (the real 1000000 / 10000 barely turn over 32
                 positions); mean pooling, Dense 32 -> 48 and Dense 48 -> 32 (no bias, identity),
                 Normalize; EmbeddingGemma's prompts (``query`` "task: search result | query: ",
                 ``document`` "title: none | text: ", twelve more by task, no default)

All but bert_st6 are rewritten in the format of the models on the Hub (saved by
sentence-transformers before 6 and transformers 4): ``"max_seq_length": 32`` in
sentence_bert_config.json (the tokenizer's ``model_max_length`` says 128, so a reader of the
wrong file truncates elsewhere), the ``pooling_mode_*`` booleans in 1_Pooling/config.json, and
ModernBERT's ``global_rope_theta``/``local_rope_theta``, Qwen3's ``rope_theta`` and Gemma 3's
``rope_theta``/``rope_local_base_freq`` (beside its ``layer_types``, with
``_sliding_window_pattern`` 4 to agree with them) in config.json instead of transformers 5's
``layer_types``/``rope_parameters``.
Every vector below is computed by sentence-transformers 6.3 loading the final directory, on the
CPU, in float32; for qwen3 in left-padded batches, as its tokenizer pads (the arrays of ids are
laid out as the others').

The inputs: the N = 130 sentences of ``tests/data/sentences.json`` and P = 6 pairs of them
(``PAIR_ROWS``; bertserve writes a pair as ``"first ||| second"``). Ids come from the model's own
tokenizer (``AutoTokenizer`` on the directory, with its special tokens); padding is id 0 whatever
the pad token's id, with ``lengths`` saying where it starts. The arrays of ``families/<name>.npz``
(T = the longest truncated row, H = hidden size, D = output size):

    sentences                  (N,) str      the sentences, in order
    pairs_first, pairs_second  (P,) str      the pairs
    ids, lengths               (N, T), (N,) int32   truncated at max_seq_length, keeping the start
    ids_left, lengths_left     (N, T), (N,) int32   truncated keeping the end (truncation_side="left")
    untruncated_lengths        (N,) int32    the token count, special tokens included, untruncated
    pair_ids, pair_lengths     (P, Tp), (P,) int32  ``tokenizer(first, second)`` truncated
                                             "longest_first" at max_seq_length, 0-padded
    pair_type_ids              (P, Tp) int32 the post-processor's type ids for the pairs, 0-padded
                                             (asked for explicitly: the model reads them only if
                                             ``token_type_ids`` is in meta's model_input_names)
    st_default                 (N, D) float32  ``model.encode(sentences)`` with all its modules
    st_pairs                   (P, D) float32  ``model.encode([(first, second), ...])``
    st_query                   (N, D) float32  ``model.encode(sentences, prompt_name="query")``,
                               for a family with a query prompt (qwen3: the prompt takes 18 of
                               the 32 tokens; gemma3: 6 of them)
    pool_<mode>                (N, H) float32  the Transformer module, then only
                               ``Pooling(H, pooling_mode=<mode>)`` (no Dense, no Normalize), for
                               mode in cls, mean, max, mean_sqrt_len_tokens, weightedmean, lasttoken
    layer_minus2_mean          (N, H) float32  ``hidden_states[-2]`` of the transformers model
                               (``output_hidden_states=True``; ``hidden_states[0]`` is the embedding
                               output, ``[i]`` the output of layer i, so ``[-2]`` is the output of
                               the second-to-last layer), averaged over the real tokens of ``ids``.
                               For ModernBERT, Qwen3 and Gemma 3 ``hidden_states[-1]`` equals
                               ``last_hidden_state`` (after the final norm) but ``[-2]`` is a raw
                               layer output: no final norm is applied to it
    tokens_last                (8, T, H) float32  the last layer's (ModernBERT, Qwen3, Gemma 3:
                               after the final norm) vectors of the first 8 sentences,
                               ``output_value="token_embeddings"``,
                               zeros at padding
    meta                       () str        JSON: versions, the CPU, config.json, max_seq_length,
                                             the modules and pooling, the tokenizer's specials,
                                             post-processor, model_input_names and padding
                                             side, the prompts, the sensitivity figures below
                                             (and for a tokenizer padding on the left, the min
                                             cosine of right-padded batches to st_default)

``meta`` is also written beside the npz as ``families/<name>.json``.

The references are sensitive. Each check computes ``st_default`` again with one detail wrong
and prints the min cosine to it over the sentences; each must be below 0.999 (this run):

    roberta      position ids from 0, not offset past the padding index       0.687
    xlm_roberta  position ids from 0, not offset past the padding index       0.887
    mpnet        position ids from 0, not offset past the padding index       0.857
    mpnet        no relative position bias (its weights scaled 5x to matter)  0.957
    modernbert   every layer global (no sliding window)                       0.909
    modernbert   the local layers with the global RoPE theta                  0.987
    distilbert   Dense without its tanh                                       0.989
    bert_st6     mean pooling instead of weighted mean                        0.996
    qwen3        bidirectional attention, not causal                          0.225
    qwen3        no q_norm/k_norm                                             0.157
    qwen3        query head h with key/value head h % 2, not h // 2           -0.392
    qwen3        RoPE theta 1000000 (Qwen3-Embedding's), not 100              -0.255
    qwen3        no <|endoftext|> appended (the last word pooled)             -0.372
    qwen3        truncated at 128 tokens instead of max_seq_length 32         0.023
    gemma3       causal attention, not bidirectional                          0.029
    gemma3       no sliding window (every layer sees every token)             0.292
    gemma3       sliding window |i - j| < 8, the config's 8 not halved to 5   0.572
    gemma3       scores scaled by head_dim ** -0.5, not query_pre_attn_scalar 0.979
    gemma3       every RMSNorm scaling by weight, not 1 + weight (25 norms)   -0.459
    gemma3       embeddings not scaled by sqrt(hidden_size)                   0.061
    gemma3       the sliding layers with the full layers' RoPE theta          0.760
    gemma3       query head h with key/value head h % 2, not h // 2           -0.569
    gemma3       no <bos> and <eos> added                                     0.567
    gemma3       truncated at 128 tokens instead of max_seq_length 32         0.151
    the others   truncated at 128 tokens instead of max_seq_length 32         0.934 to 0.985

Three things to know. The trainers of ``tokenizers`` (WordPiece, Unigram) are not deterministic
from run to run, so a new run writes other vocabularies and other figures, equally valid. And
``tokenizers`` alone on an XLM-R tokenizer.json can break a tie between equal-score
segmentations ("0" "00000" against "00000" "0") the other way from ``AutoTokenizer``, which
rebuilds the Unigram model in Python: meta's ``raw_tokenizer_mismatches`` lists those rows.
And transformers' Qwen3 gives every row of a batch the positions 0 .. T-1, whatever its padding
(no position ids made from the attention mask): a left-padded row's tokens start after its
padding. RoPE sees only their differences, so right-padded batches, whose rows start at 0, give
the same vectors but for rounding (meta's ``padded_right_min_cosine``, 1.0000000 this run).

What transformers 5.25 computes for Gemma 3 (modeling_gemma3.py, configuration_gemma3.py and
masking_utils.py, each checked on this model; meta's ``gemma3_loaded`` has the values loaded):

- the embedding: ``embed_tokens(ids) * sqrt(hidden_size)``, the scale a float32 tensor cast to
  the weights' dtype before the product (in bfloat16 sqrt(32) = 5.65685 is 5.65625, EmbeddingGemma's
  sqrt(768) = 27.7128 is 27.75; in float16 27.71875); ``hidden_states[0]`` is the scaled embedding;
- the norm: ``x / sqrt(mean(x ** 2) + eps) * (1 + weight)`` in float32, cast back to the input's
  dtype after the product, its weights starting at 0; four around each layer's two blocks
  (input_layernorm before attention, post_attention_layernorm on its output before the residual
  add, pre_feedforward_layernorm before the MLP, post_feedforward_layernorm on its output before the
  residual add), q_norm and k_norm on each head's 12 values before RoPE, and the final norm;
- attention: scores ``q . k * query_pre_attn_scalar ** -0.5`` (0.25 here, not 12 ** -0.5), no soft
  capping, query head h with key/value head h // 2; the full layers see every real token, the
  sliding ones a band: ``use_bidirectional_attention`` turns the config's window w into
  w // 2 + 1 on loading (and back into (w // 2) * 2 on saving), and token i sees token j if
  |i - j| < w // 2 + 1, that is |i - j| <= w // 2: 4 here, 256 for EmbeddingGemma's 512; no query
  sees a padding key;
- RoPE (rotate-half, over head_dim, positions 0 .. T-1): the full_attention layers with
  ``rope_theta``, the sliding_attention layers with ``rope_local_base_freq``;
- the MLP: ``down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))``, gelu_pytorch_tanh being GELU's
  tanh approximation;
- ``hidden_states``: 5 of them, the embedding then each layer's output; ``[-1]`` is
  ``last_hidden_state`` (the fourth layer's output after the final norm), ``[-2]`` the third
  layer's raw output.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import sentence_transformers
import tokenizers
import torch
import transformers
from lib import variant_models
from lib.reference_stack import (
    FAMILIES,
    FAMILIES_DIR,
    PAIR_ROWS,
    SENTENCES,
    SMALL,
    Family,
    overwritten,
    patched,
    rewrite_json,
    tokenizer_meta,
)
from lib.references import cpu, padded
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import masking_utils
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX
from transformers.models.qwen3 import modeling_qwen3

MAX_SEQ_LENGTH = 32  # in sentence_bert_config.json, as the Hub's models have it
TOKENIZER_MAX_LENGTH = 128  # what their tokenizer_config.json says instead
ST6_MAX_LENGTH = 40  # bert_st6 has no max_seq_length: its tokenizer's model_max_length rules
VOCAB_SIZE = 700
POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
LEGACY_POOLING_KEYS = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens")
LEGACY_POOLING_KEYS += ("lasttoken",)  # the booleans before sentence-transformers 6, in its order
TOKEN_ROWS = 8
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
QWEN3_PROMPTS = {
    "query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
    "document": "",
}
QWEN3 = Family(
    "qwen3",
    dict(
        model_type="qwen3",
        **{**SMALL, "num_hidden_layers": 3},
        num_key_value_heads=2,
        head_dim=12,  # q_proj 32 -> 48: not hidden_size / heads, as in the real model (1024 -> 2048)
        rope_theta=100.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=128,
        hidden_act="silu",
        attention_bias=False,
        use_sliding_window=False,
        tie_word_embeddings=True,
    ),
    pooling="lasttoken",
)
GEMMA3_PROMPTS = {  # EmbeddingGemma's, in its order
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "BitextMining": "task: search result | query: ",
    "Clustering": "task: clustering | query: ",
    "Classification": "task: classification | query: ",
    "InstructionRetrieval": "task: code retrieval | query: ",
    "MultilabelClassification": "task: classification | query: ",
    "PairClassification": "task: sentence similarity | query: ",
    "Reranking": "task: search result | query: ",
    "Retrieval": "task: search result | query: ",
    "Retrieval-query": "task: search result | query: ",
    "Retrieval-document": "title: none | text: ",
    "STS": "task: sentence similarity | query: ",
    "Summarization": "task: summarization | query: ",
}
GEMMA3_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]  # ids 0 to 4, as in Gemma's vocabulary
GEMMA3_LEFT_OUT = "\N{SLIGHTLY SMILING FACE}"  # not in the vocabulary: falls back to its 4 bytes
GEMMA3 = Family(
    "gemma3",
    dict(
        model_type="gemma3_text",
        **{**SMALL, "num_hidden_layers": 4},
        num_key_value_heads=2,
        head_dim=12,  # q_proj 32 -> 48, as EmbeddingGemma's 768 -> 768 (3 heads of 256)
        query_pre_attn_scalar=16,  # the scores scaled by 16 ** -0.5, not head_dim ** -0.5
        layer_types=["sliding_attention"] * 3 + ["full_attention"],  # EmbeddingGemma: 5 sliding, 1 full
        sliding_window=8,  # bidirectional: |i - j| <= 4
        use_bidirectional_attention=True,
        rope_theta=100.0,  # the full layers' (EmbeddingGemma's 1000000)
        rope_local_base_freq=10.0,  # the sliding layers' (EmbeddingGemma's 10000)
        rms_norm_eps=1e-6,
        max_position_embeddings=128,
        hidden_activation="gelu_pytorch_tanh",
        attention_bias=False,
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        tie_word_embeddings=True,
    ),
)
GEMMA3_DENSE = (48, 32)  # EmbeddingGemma's 768 -> 3072 -> 768: no bias, no activation
ALL_FAMILIES = (*FAMILIES, QWEN3, GEMMA3)
# config_sentence_transformers.json's, where a family ships some
PROMPTS = {"qwen3": QWEN3_PROMPTS, "gemma3": GEMMA3_PROMPTS}


def _train(tokenizer: Tokenizer, trainer: Any, texts: list[str]) -> dict[str, Any]:
    tokenizer.train_from_iterator(texts, trainer)
    return json.loads(tokenizer.to_str())["model"]


def _wordpiece_vocab(texts: list[str], specials: list[str], unk: str = "[UNK]", mask: bool = False) -> dict[str, int]:
    tokenizer = Tokenizer(models.WordPiece(unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    vocab = _train(tokenizer, trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials), texts)["vocab"]
    return {**vocab, "<mask>": len(vocab)} if mask else vocab  # <mask> last, as RoBERTa and MPNet have it


def _byte_bpe(tokenizer: Tokenizer, texts: list[str], specials: list[str], mask: bool = False) -> tuple[dict, list]:
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    model = _train(
        tokenizer, trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials, initial_alphabet=alphabet), texts
    )
    vocab = {**model["vocab"], "<mask>": len(model["vocab"])} if mask else model["vocab"]
    return vocab, [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]


def _precompiled_charsmap(texts: list[str]) -> bytes:
    """A normalization table compiled by SentencePiece, as XLM-R's tokenizer.json holds one: its
    nmt_nfkc table alone is 320 KB, so this one has a few of its rules (full-width letters and
    digits, the fi/fl ligatures, the no-break space, the ellipsis)."""
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2

    rules = [(0xFF21 + i, 0x41 + i) for i in range(26)] + [(0xFF41 + i, 0x61 + i) for i in range(26)]
    rules += [(0xFF10 + i, 0x30 + i) for i in range(10)] + [(0xA0, 0x20)]
    lines = [f"{a:X}\t{b:X}" for a, b in rules] + ["FB01\t66 69", "FB02\t66 6C", "2026\t2E 2E 2E"]
    with tempfile.TemporaryDirectory() as tmp:
        tsv = Path(tmp) / "rules.tsv"
        tsv.write_text("\n".join(lines) + "\n")
        out = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=out,
            vocab_size=400,
            normalization_rule_tsv=str(tsv),
            hard_vocab_limit=False,
            minloglevel=2,
        )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(out.getvalue())
    return proto.normalizer_spec.precompiled_charsmap


def _xlm_roberta_tokenizer(texts: list[str]) -> transformers.XLMRobertaTokenizer:
    charsmap = _precompiled_charsmap(texts)
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Precompiled(charsmap)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()])
    trainer = trainers.UnigramTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>"
    )
    vocab = [tuple(piece) for piece in _train(tokenizer, trainer, texts)["vocab"]]
    return transformers.XLMRobertaTokenizer(vocab=[*vocab, ("<mask>", 0.0)], _spm_precompiled_charsmap=charsmap)


def _modernbert_tokenizer(texts: list[str]) -> transformers.PreTrainedTokenizerFast:
    """OLMo's byte-level BPE as ModernBERT has it: NFC, <|endoftext|> and <|padding|> first, the
    BERT specials at the end of the vocabulary, [CLS] A [SEP] (B [SEP]) added by a template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer, tokenizer.decoder = normalizers.NFC(), decoders.ByteLevel()
    _byte_bpe(tokenizer, texts, ["<|endoftext|>", "<|padding|>"])
    tokenizer.add_special_tokens([AddedToken(t, normalized=False) for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]")])
    tokenizer.add_special_tokens([AddedToken("[MASK]", lstrip=True, normalized=False)])
    ids = [("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))]
    template = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1", special_tokens=ids
    )
    tokenizer.post_processor = template
    specials = dict(unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_input_names=["input_ids", "attention_mask"], **specials
    )


def _qwen3_tokenizer(texts: list[str]) -> transformers.Qwen2Tokenizer:
    """Qwen2's byte-level BPE as Qwen3-Embedding has it: NFC, Qwen's split (digits one by one),
    <|endoftext|> <|im_start|> <|im_end|> after the vocabulary, <|endoftext|> appended by a template
    (also the pad token; the eos token is <|im_end|>), padding on the left."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    split = pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # the query prompt's words whole, as in Qwen's vocabulary: 18 tokens, not 50 that would fill
    # max_seq_length and leave every query the same
    model = _train(tokenizer, trainer, texts + [QWEN3_PROMPTS["query"]] * 10)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    qwen = transformers.Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=merges,
        unk_token=None,
        eos_token="<|endoftext|>",  # <|endoftext|> first among the added tokens, then the chat's two
        pad_token="<|endoftext|>",
        extra_special_tokens=["<|im_start|>", "<|im_end|>"],
        padding_side="left",
    )
    qwen.eos_token = "<|im_end|>"
    end = ("<|endoftext|>", qwen.pad_token_id)
    qwen.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A:0 <|endoftext|>:0", pair="$A:0 <|endoftext|>:0 $B:1 <|endoftext|>:1", special_tokens=[end]
    )
    return qwen


def _gemma3_tokenizer(texts: list[str]) -> transformers.GemmaTokenizer:
    """Gemma's SentencePiece BPE as EmbeddingGemma has it: spaces made "▁" and kept at the start
    of a word, byte fallback (the 256 byte tokens after the specials), <pad> <eos> <bos> <unk>
    <mask> at ids 0 to 4, <bos> A <eos> (<bos> B <eos>) added by a template, padding on the right."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")  # no merge across words
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE + len(bytes_), special_tokens=GEMMA3_SPECIALS + bytes_)
    # the prompts' words whole, as in Gemma's vocabulary; one emoji left out, for the byte fallback
    seen = [t.replace(GEMMA3_LEFT_OUT, "") for t in texts] + list(GEMMA3_PROMPTS.values()) * 10
    model = _train(tokenizer, trainer, seen)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return transformers.GemmaTokenizer(
        vocab=model["vocab"], merges=merges, add_bos_token=True, add_eos_token=True, padding_side="right"
    )


TOKENIZERS: dict[str, Callable[[list[str]], Any]] = {
    "distilbert": lambda texts: transformers.DistilBertTokenizer(vocab=_wordpiece_vocab(texts, BERT_SPECIALS)),
    "bert_st6": lambda texts: transformers.BertTokenizer(vocab=_wordpiece_vocab(texts, BERT_SPECIALS)),
    # BERT's WordPiece with <s> <pad> </s> <unk> first; its unknown token stays [UNK]
    "mpnet": lambda texts: transformers.MPNetTokenizer(
        vocab=_wordpiece_vocab(texts, ["<s>", "<pad>", "</s>", "<unk>", "[UNK]"], mask=True)
    ),
    "roberta": lambda texts: transformers.RobertaTokenizer(
        *_byte_bpe(Tokenizer(models.BPE()), texts, ["<s>", "<pad>", "</s>", "<unk>"], True)
    ),
    "xlm_roberta": _xlm_roberta_tokenizer,
    "modernbert": _modernbert_tokenizer,
    "qwen3": _qwen3_tokenizer,
    "gemma3": _gemma3_tokenizer,
}


def build(family: Family, texts: list[str], out: Path) -> None:
    """Make the family's tiny random model and save it with sentence-transformers into ``out``."""
    torch.manual_seed(sum(map(ord, family.name)))
    tokenizer = TOKENIZERS[family.name](texts)
    tokenizer.model_max_length = ST6_MAX_LENGTH if family.st6 else MAX_SEQ_LENGTH
    ids = {}
    if family.name == "modernbert":
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        ids = dict(
            pad_token_id=tokenizer.pad_token_id, cls_token_id=cls, sep_token_id=sep, bos_token_id=cls, eos_token_id=sep
        )
    if family.name == "qwen3":  # as Qwen3-Embedding's: no pad token id, which would zero its embedding row
        end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        ids = dict(bos_token_id=end, eos_token_id=end)
    if family.name == "gemma3":
        specials = ("pad", "bos", "eos")
        ids = {f"{n}_token_id": getattr(tokenizer, f"{n}_token_id") for n in specials}
    config = transformers.AutoConfig.for_model(**family.config, **ids, vocab_size=len(tokenizer), initializer_range=0.2)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager")
    # LayerNorm/RMSNorm weights off 1 (Gemma's off 0, its norms scaling by 1 + weight), biases off 0:
    # a reader that drops one is seen
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 1:
                parameter.add_(0.1 * torch.randn_like(parameter))
        for name, factor in family.scale:
            model.get_parameter(name).mul_(factor)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        transformer = Transformer(tmp)
        hidden = transformer.get_embedding_dimension()
        modules: list[torch.nn.Module] = [transformer, Pooling(hidden, pooling_mode=family.pooling)]
        modules += [Dense(hidden, family.dense, activation_function=torch.nn.Tanh())] if family.dense else []
        if family.name == "gemma3":
            identity = torch.nn.Identity()
            sizes = (hidden, *GEMMA3_DENSE)
            modules += [Dense(a, b, bias=False, activation_function=identity) for a, b in itertools.pairwise(sizes)]
        modules += [Normalize()] if family.normalize else []
        shutil.rmtree(out, ignore_errors=True)
        prompts = PROMPTS.get(family.name)
        SentenceTransformer(modules=modules, device="cpu", prompts=prompts).save(str(out), create_model_card=False)
    if not family.st6:
        _rewrite_as_on_the_hub(out)


def _legacy_pooling(pooling: dict) -> dict:
    legacy = {"word_embedding_dimension": pooling["embedding_dimension"]}
    legacy.update(
        {
            f"pooling_mode_{key}": mode == pooling["pooling_mode"]
            for mode, key in zip(POOLING_MODES, LEGACY_POOLING_KEYS, strict=True)
        }
    )
    return {**legacy, "include_prompt": pooling["include_prompt"]}


def _rewrite_as_on_the_hub(out: Path) -> None:
    """The files as sentence-transformers before 6 and transformers 4 wrote them."""
    rewrite_json(
        out / "sentence_bert_config.json", lambda _: {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False}
    )
    rewrite_json(out / "1_Pooling" / "config.json", _legacy_pooling)
    rewrite_json(out / "tokenizer_config.json", lambda config: {**config, "model_max_length": TOKENIZER_MAX_LENGTH})

    def transformers_4_keys(config: dict) -> dict:
        if config["model_type"] == "modernbert":
            rope = config.pop("rope_parameters")
            del config["layer_types"]
            config["global_rope_theta"] = rope["full_attention"]["rope_theta"]
            config["local_rope_theta"] = rope["sliding_attention"]["rope_theta"]
        if config["model_type"] == "qwen3":
            config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]
            config["rope_scaling"] = None
            del config["layer_types"]
        if config["model_type"] == "gemma3_text":  # EmbeddingGemma's config.json keeps its layer_types
            rope = config.pop("rope_parameters")
            config["rope_theta"] = rope["full_attention"]["rope_theta"]
            config["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
            config["rope_scaling"] = None
            # one full layer in every 4, as its layer_types say (EmbeddingGemma's 6 for 5 sliding, 1 full)
            config["_sliding_window_pattern"] = config["layer_types"].index("full_attention") + 1
        return dict(sorted(config.items()))

    rewrite_json(out / "config.json", transformers_4_keys)


def _encode(model: SentenceTransformer, texts: list, **kwargs: Any) -> Any:
    with torch.inference_mode():
        return model.encode(texts, batch_size=32, convert_to_numpy=True, **kwargs)


def _encode_by_hand(model: SentenceTransformer, texts: list[str], **forward: Callable) -> np.ndarray:
    """``model.encode`` spelled out, with ``forward``'s arguments (made from the features) given
    to the transformers model."""
    with torch.inference_mode():
        features = model[0].preprocess(texts)
        features = model[0](features, **{key: make(features) for key, make in forward.items()})
        for module in list(model)[1:]:
            features = module(features)
    return features["sentence_embedding"].numpy()


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    cos = (a64 * b64).sum(1) / np.linalg.norm(a64, axis=1) / np.linalg.norm(b64, axis=1)
    return float(cos.min())


@contextlib.contextmanager
def _together(*contexts: Any) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        yield


def _heads_paired_by_remainder(auto: Any) -> Any:
    """Query head h read with key/value head h % kv_heads instead of h // (heads / kv_heads): a
    model whose query heads are reordered (and o_proj's columns with them) computes just that."""
    config = auto.config
    heads, kv_heads, size = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    order = torch.arange(heads).view(heads // kv_heads, kv_heads).t().reshape(-1)
    contexts = []
    for layer in auto.layers:
        q, o = layer.self_attn.q_proj.weight, layer.self_attn.o_proj.weight
        contexts.append(overwritten(q, q.view(heads, size, -1)[order].reshape(q.shape)))
        contexts.append(overwritten(o, o.view(o.shape[0], heads, size)[:, order].reshape(o.shape)))
    return _together(*contexts)


def _qwen3_checks(model: SentenceTransformer) -> list[tuple[str, Any, dict[str, Callable]]]:
    auto = model[0].auto_model
    bidirectional = _together(
        patched(modeling_qwen3, "create_causal_mask", masking_utils.create_bidirectional_mask),
        *(patched(layer.self_attn, "is_causal", False) for layer in auto.layers),
    )
    no_qk_norm = _together(
        *(patched(layer.self_attn, n, torch.nn.Identity()) for layer in auto.layers for n in ("q_norm", "k_norm"))
    )
    halves = torch.arange(0, auto.config.head_dim, 2, dtype=torch.float) / auto.config.head_dim
    real_theta = overwritten(auto.rotary_emb.inv_freq, 1.0 / 1_000_000.0**halves)
    bare = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1")
    no_end = patched(model[0].tokenizer.backend_tokenizer, "post_processor", bare)
    return [
        ("bidirectional attention, not causal", bidirectional, {}),
        ("no q_norm/k_norm", no_qk_norm, {}),
        ("query head h with key/value head h % 2, not h // 2", _heads_paired_by_remainder(auto), {}),
        ("RoPE theta 1000000 (Qwen3-Embedding's), not 100", real_theta, {}),
        ("no <|endoftext|> appended (the last word pooled)", no_end, {}),
    ]


def _gemma3_checks(model: SentenceTransformer) -> list[tuple[str, Any, dict[str, Callable]]]:
    auto = model[0].auto_model
    config = auto.config
    causal = _together(
        patched(config, "use_bidirectional_attention", False),
        *(patched(layer.self_attn, "is_causal", True) for layer in auto.layers),
    )
    # the config holds the window as transformers uses it: 8 // 2 + 1 = 5, for |i - j| < 5
    no_window = patched(config, "sliding_window", 4096)
    not_halved = patched(config, "sliding_window", 8)
    head_dim_scaling = _together(*(patched(layer.self_attn, "scaling", config.head_dim**-0.5) for layer in auto.layers))
    norms = [module for module in auto.modules() if isinstance(module, modeling_gemma3.Gemma3RMSNorm)]
    no_plus_one = _together(*(overwritten(norm.weight, norm.weight.detach() - 1.0) for norm in norms))
    rotary = auto.rotary_emb
    global_theta = overwritten(rotary.sliding_attention_inv_freq, rotary.full_attention_inv_freq)
    bare = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1")
    no_specials = patched(model[0].tokenizer.backend_tokenizer, "post_processor", bare)
    return [
        ("causal attention, not bidirectional", causal, {}),
        ("no sliding window (every layer sees every token)", no_window, {}),
        ("sliding window |i - j| < 8, the config's 8 not halved to 5", not_halved, {}),
        ("scores scaled by head_dim ** -0.5, not query_pre_attn_scalar ** -0.5", head_dim_scaling, {}),
        ("every RMSNorm scaling by weight, not 1 + weight (25 norms)", no_plus_one, {}),
        ("embeddings not scaled by sqrt(hidden_size)", overwritten(auto.embed_tokens.embed_scale, 1.0), {}),
        ("the sliding layers with the full layers' RoPE theta", global_theta, {}),
        ("query head h with key/value head h % 2, not h // 2", _heads_paired_by_remainder(auto), {}),
        ("no <bos> and <eos> added", no_specials, {}),
    ]


def _gemma3_loaded(model: SentenceTransformer) -> dict[str, Any]:
    """The values the loaded model computes with, beside those config.json says."""
    auto = model[0].auto_model
    config, rotary = auto.config, auto.rotary_emb
    halves = torch.arange(0, config.head_dim, 2, dtype=torch.float) / config.head_dim
    theta = {
        kind: float((1.0 / getattr(rotary, f"{kind}_inv_freq")[1]) ** (1.0 / halves[1]))
        for kind in ("full_attention", "sliding_attention")
    }
    scale = auto.embed_tokens.embed_scale
    return {
        "embed_scale": float(scale),
        "embed_scale_bfloat16": float(scale.to(torch.bfloat16)),
        "sliding_window_loaded": config.sliding_window,
        "sliding_rule": f"|i - j| < {config.sliding_window}",
        "attention_scaling": [layer.self_attn.scaling for layer in auto.layers],
        "rope_theta_by_layer": [round(theta[kind], 3) for kind in config.layer_types],
        "hidden_act": config.hidden_activation,
    }


def _checks(name: str, model: SentenceTransformer) -> list[tuple[str, Any, dict[str, Callable]]]:
    """(what is wrong, a context that makes it so, arguments for the transformers model)."""
    auto = model[0].auto_model
    from_zero = {"position_ids": lambda f: torch.arange(f["input_ids"].shape[1]).expand_as(f["input_ids"])}
    checks: list[tuple[str, Any, dict[str, Callable]]] = []
    if name in ("roberta", "xlm_roberta", "mpnet"):
        checks.append(("position ids from 0, not offset past the padding index", contextlib.nullcontext(), from_zero))
    if name == "mpnet":
        checks.append(("no relative position bias", overwritten(auto.encoder.relative_attention_bias.weight, 0.0), {}))
    if name == "modernbert":
        checks.append(("every layer global (no sliding window)", patched(auto.config, "local_attention", 4096), {}))
        rotary = auto.rotary_emb
        wrong_theta = overwritten(rotary.sliding_attention_inv_freq, rotary.full_attention_inv_freq)
        checks.append(("the local layers with the global RoPE theta", wrong_theta, {}))
    if name == "distilbert":
        checks.append(("Dense without its tanh", patched(model[2], "activation_function", torch.nn.Identity()), {}))
    if name == "bert_st6":
        checks.append(("mean pooling instead of weighted mean", patched(model[1], "pooling_mode", "mean"), {}))
    if name == "qwen3":
        checks += _qwen3_checks(model)
    if name == "gemma3":
        checks += _gemma3_checks(model)
    if model.max_seq_length == MAX_SEQ_LENGTH:
        label = f"truncated at {TOKENIZER_MAX_LENGTH} tokens instead of max_seq_length {MAX_SEQ_LENGTH}"
        checks.append((label, patched(model[0], "max_seq_length", TOKENIZER_MAX_LENGTH), {}))
    return checks


def sensitivity(name: str, model: SentenceTransformer, texts: list[str], reference: np.ndarray) -> dict[str, float]:
    same = _min_cosine(_encode_by_hand(model, texts), reference)
    assert same > 0.999999, f"{name}: encoding by hand gives min cosine {same} to model.encode"
    figures = {}
    for label, context, forward in _checks(name, model):
        with context:
            figures[label] = round(_min_cosine(_encode_by_hand(model, texts, **forward), reference), 6)
        print(f"  {name:12s} {label:70s} min cosine {figures[label]:.4f}")
        assert figures[label] < 0.999, f"{name}: the references do not see {label!r}"
    return figures


def _tokenized(tokenizer: Any, texts: list[str], max_length: int, side: str) -> tuple[np.ndarray, np.ndarray]:
    tokenizer.truncation_side = side
    rows = [tokenizer(t, truncation=True, max_length=max_length)["input_ids"] for t in texts]
    tokenizer.truncation_side = "right"
    return padded(rows)


def _raw_tokenizer_mismatches(out: Path, texts: list[str], max_length: int, arrays: dict) -> dict[str, list[int]]:
    """The rows where the ``tokenizers`` library alone, on tokenizer.json, gives other ids than
    ``AutoTokenizer`` (transformers 5 rebuilds a Unigram model from its vocabulary, which breaks
    ties between equal-score segmentations, such as "0" "00000" and "00000" "0", the other way)."""
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    mismatches = {}
    for side, key in (("right", "ids"), ("left", "ids_left")):
        raw.enable_truncation(max_length, direction=side)
        rows = padded([e.ids for e in raw.encode_batch(texts)], arrays[key].shape[1])[0]
        mismatches[key] = np.flatnonzero((rows != arrays[key]).any(1)).tolist()
    raw.enable_truncation(max_length, direction="right")
    pairs = raw.encode_batch(list(zip(arrays["pairs_first"].tolist(), arrays["pairs_second"].tolist(), strict=True)))
    width = arrays["pair_ids"].shape[1]
    ids, type_ids = padded([e.ids for e in pairs], width)[0], padded([e.type_ids for e in pairs], width)[0]
    different = (ids != arrays["pair_ids"]) | (type_ids != arrays["pair_type_ids"])
    mismatches["pair_ids"] = np.flatnonzero(different.any(1)).tolist()
    if any(mismatches.values()):
        print(f"  {out.name:12s} tokenizers on tokenizer.json differs from AutoTokenizer in rows {mismatches}")
    return mismatches


def _right_aligned(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Each row's real positions moved to its start, zeros after them: a left-padded batch laid
    out as the arrays here are (a right-padded one stays as it is)."""
    out = np.zeros_like(values)
    for i, real in enumerate(mask.astype(bool)):
        out[i, : real.sum()] = values[i][real]
    return out


def _token_arrays(model: SentenceTransformer, tokenizer: Any, texts: list[str], arrays: dict) -> dict[str, Any]:
    max_length = model.max_seq_length
    batch = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    real = batch["attention_mask"].numpy()
    np.testing.assert_array_equal(_right_aligned(batch["input_ids"].numpy(), real), arrays["ids"])
    with torch.inference_mode():
        output = model[0].auto_model(**batch, output_hidden_states=True)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    hidden = output.hidden_states[-2]
    arrays["layer_minus2_mean"] = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    tokens = np.zeros((TOKEN_ROWS, arrays["ids"].shape[1], hidden.shape[-1]), np.float32)
    for i, vectors in enumerate(_encode(model, texts[:TOKEN_ROWS], output_value="token_embeddings")):
        assert len(vectors) == arrays["lengths"][i], "token_embeddings are not trimmed to the real tokens"
        tokens[i, : len(vectors)] = np.asarray(vectors)
    last = _right_aligned(output.last_hidden_state[:TOKEN_ROWS].numpy(), real[:TOKEN_ROWS])
    np.testing.assert_allclose(tokens, last, atol=1e-5)
    arrays["tokens_last"] = tokens
    last_is_final = bool(torch.equal(output.hidden_states[-1], output.last_hidden_state))
    return {"hidden_states_count": len(output.hidden_states), "hidden_states_last_is_last_hidden_state": last_is_final}


def references(family: Family, out: Path, sentences: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    remote = family.name in variant_models.CODE  # run by the code in ``out``
    model = variant_models.loaded(str(out), device="cpu") if remote else SentenceTransformer(str(out), device="cpu")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out), trust_remote_code=remote)
    max_length = model.max_seq_length
    assert max_length == (ST6_MAX_LENGTH if family.st6 else MAX_SEQ_LENGTH), max_length
    first = [sentences[a] for a, _ in PAIR_ROWS]
    second = [sentences[b] for _, b in PAIR_ROWS]
    arrays: dict[str, np.ndarray] = {
        "sentences": np.asarray(sentences, dtype=np.str_),
        "pairs_first": np.asarray(first, dtype=np.str_),
        "pairs_second": np.asarray(second, dtype=np.str_),
    }
    arrays["ids"], arrays["lengths"] = _tokenized(tokenizer, sentences, max_length, "right")
    arrays["ids_left"], arrays["lengths_left"] = _tokenized(tokenizer, sentences, max_length, "left")
    arrays["untruncated_lengths"] = np.asarray([len(tokenizer(s)["input_ids"]) for s in sentences], np.int32)
    pairs = [
        tokenizer(a, b, truncation="longest_first", max_length=max_length, return_token_type_ids=True)
        for a, b in zip(first, second, strict=True)
    ]
    arrays["pair_ids"], arrays["pair_lengths"] = padded([p["input_ids"] for p in pairs])
    arrays["pair_type_ids"] = padded([p["token_type_ids"] for p in pairs])[0]
    raw_mismatches = _raw_tokenizer_mismatches(out, sentences, max_length, arrays)

    arrays["st_default"] = _encode(model, sentences)
    pair_features = model[0].preprocess(list(zip(first, second, strict=True)))
    np.testing.assert_array_equal(
        _right_aligned(pair_features["input_ids"].numpy(), pair_features["attention_mask"].numpy()),
        arrays["pair_ids"],
    )
    arrays["st_pairs"] = _encode(model, list(zip(first, second, strict=True)))
    if model.prompts.get("query"):
        arrays["st_query"] = _encode(model, sentences, prompt_name="query")
    hidden = model[0].get_embedding_dimension()
    for mode in POOLING_MODES:
        pooled = SentenceTransformer(modules=[model[0], Pooling(hidden, pooling_mode=mode)], device="cpu")
        arrays[f"pool_{mode}"] = _encode(pooled, sentences)
    hidden_meta = _token_arrays(model, tokenizer, sentences, arrays)
    modules = json.loads((out / "modules.json").read_text())
    meta = {
        "family": family.name,
        "config": json.loads((out / "config.json").read_text()),
        "max_seq_length": max_length,
        "max_seq_length_from": "tokenizer_config.json model_max_length" if family.st6 else "sentence_bert_config.json",
        "modules": modules,
        "pooling_config": json.loads((out / "1_Pooling" / "config.json").read_text()),
        "pooling": family.pooling,
        "tokenizer": {**tokenizer_meta(out, tokenizer), "padding_side": tokenizer.padding_side},
        "prompts": model.prompts,
        "pair_rows": PAIR_ROWS,
        "raw_tokenizer_mismatches": raw_mismatches,
        "tokens_rows": TOKEN_ROWS,
        **hidden_meta,
        "sensitivity": sensitivity(family.name, model, sentences, arrays["st_default"]),
    }
    if family.name == "gemma3":
        meta["gemma3_loaded"] = _gemma3_loaded(model)
    if tokenizer.padding_side == "left":
        meta["padded_right_min_cosine"] = _padded_right(family.name, model, sentences, arrays["st_default"])
    return arrays, meta


def _padded_right(name: str, model: SentenceTransformer, texts: list[str], reference: np.ndarray) -> float:
    """The min cosine to ``reference`` of the sentences encoded in right-padded batches: each
    row's positions then start at 0, not after its padding, and RoPE, which sees only their
    differences, gives the same vectors but for rounding."""
    with patched(model[0].tokenizer, "padding_side", "right"):
        figure = round(_min_cosine(_encode(model, texts), reference), 7)
    print(f"  {name:12s} {'right-padded batches':70s} min cosine {figure:.7f}")
    assert figure > 0.99999, f"{name}: right-padded batches give min cosine {figure}"
    return figure


def build_variant(family: Family, code: Path, texts: list[str], out: Path) -> None:
    """A BERT variant's tiny random model, made by its own code (:mod:`lib.variant_models`), with
    a BERT WordPiece tokenizer, in the format of the models on the Hub."""
    if family.name == "jina_v3":  # XLM-RoBERTa's
        tokenizer = _xlm_roberta_tokenizer(texts)
    else:
        tokenizer = transformers.BertTokenizer(vocab=_wordpiece_vocab(texts, BERT_SPECIALS))
    tokenizer.model_max_length = MAX_SEQ_LENGTH
    variant_models.build(family, code, tokenizer, out)
    _rewrite_as_on_the_hub(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=FAMILIES_DIR)
    parser.add_argument("--only", choices=[f.name for f in (*ALL_FAMILIES, *variant_models.VARIANTS)], action="append")
    parser.add_argument("--code", type=Path, help="the BERT variants' code: gte/, nomic_bert/, jina_bert/")
    args = parser.parse_args()
    sentences = json.loads(SENTENCES.read_text(encoding="utf-8"))
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    for family in (*ALL_FAMILIES, *variant_models.VARIANTS):
        variant = family in variant_models.VARIANTS
        if (args.only and family.name not in args.only) or (variant and args.code is None):
            continue
        out = args.out_dir / family.name
        if variant:
            build_variant(family, args.code, sentences, out)
        else:
            build(family, sentences, out)
        arrays, meta = references(family, out, sentences)
        if family.name == "jina_v3":  # before its code is left out
            arrays.update(variant_models.adapter_references(out, sentences))
            meta["adapters"] = list(variant_models.JINA_V3_PROMPTS)
        if variant:
            meta["config"] = variant_models.as_downloaded(out, family.name)
            meta["code"] = variant_models.CODE[family.name][0]
            meta["hidden_states_from"] = "forward hooks" if family.name == "nomic_bert" else "the model"
        versions = {lib.__name__: lib.__version__ for lib in (sentence_transformers, transformers, torch, tokenizers)}
        meta.update(versions, cpu=cpu()[0], cpu_flags=cpu()[1], torch_threads=torch.get_num_threads())
        arrays["meta"] = np.asarray(json.dumps(meta, ensure_ascii=False))
        for key, value in arrays.items():
            assert value.dtype not in (np.float64, np.int64), key
        np.savez_compressed(args.out_dir / f"{family.name}.npz", **arrays)
        (args.out_dir / f"{family.name}.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in arrays.items() if k != "meta")
        print(f"wrote {out} and {family.name}.npz: {shapes}")


if __name__ == "__main__":
    main()
