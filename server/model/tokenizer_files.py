"""The model's tokenizer as the ``tokenizers`` library reads it from the model's files, and
the special tokens its post-processor adds.

``tokenizer.json`` is used as it is: its normalizer, pre-tokenizer, model (WordPiece, BPE or
Unigram) and post-processor are the model's own (a Unigram's scores read as transformers reads
them). A bare ``vocab.txt`` gets BERT's pipeline
(clean text, CJK characters split, accents stripped when lower-casing, punctuation split,
WordPiece with ``[UNK]``, ``[CLS] A [SEP] B [SEP]``). The special tokens are read from the
post-processor by having it process one word, whatever its kind (``BertProcessing``,
``RobertaProcessing``, ``TemplateProcessing`` or a ``Sequence`` of them), never from a list
of names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import ModelFileError

CLS, SEP, UNK = "[CLS]", "[SEP]", "[UNK]"


@dataclass(frozen=True)
class Specials:
    """The ids of the special tokens the post-processor puts before a single input
    (``[CLS]``, ``<s>``) and after it (``[SEP]``, ``</s>``), and how many it adds to a pair
    (3 for ``[CLS] A [SEP] B [SEP]``, 4 for ``<s> A </s></s> B </s>``)."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    pair: int

    @property
    def single(self) -> int:
        return len(self.prefix) + len(self.suffix)


def read_tokenizer(vocab_path: str | None, tokenizer_json: str | None, do_lower_case: bool):  # -> tokenizers.Tokenizer
    """The model's tokenizer, from ``tokenizer_json`` where there is one, else ``vocab_path``."""
    if tokenizer_json is not None:
        return _from_json(tokenizer_json, do_lower_case)
    if vocab_path is not None:
        return _bert_tokenizer(vocab_path, do_lower_case)
    raise ModelFileError("the model directory has neither tokenizer.json nor vocab.txt")


def special_tokens(tokenizer: Any, source: str | None, required: bool = True) -> Specials:
    """The special tokens ``tokenizer`` (read from ``source``) adds, found by having its
    post-processor process one word; refused if it adds none around an input and they are ``required``."""
    from tokenizers import Tokenizer, models

    probe = Tokenizer(models.WordLevel({"w": 0}, unk_token="w"))
    if tokenizer.post_processor is not None:
        probe.post_processor = tokenizer.post_processor
    encoding = probe.encode(["w"], is_pretokenized=True)
    word = encoding.sequence_ids.index(0)
    prefix, suffix = tuple(encoding.ids[:word]), tuple(encoding.ids[word + 1 :])
    if not prefix and not suffix and required:
        raise ModelFileError(
            f"{source} adds no special tokens around an input (its post_processor is "
            f"{type(tokenizer.post_processor).__name__}); the model's pooling needs its own first and last "
            "tokens: give tokenizer.json the model's TemplateProcessing, BertProcessing or RobertaProcessing"
        )
    return Specials(prefix, suffix, tokenizer.num_special_tokens_to_add(True))


def unk_id(tokenizer: Any) -> int | None:
    """The id of the model's unknown token; None if it has none (byte-level BPE)."""
    unk = getattr(tokenizer.model, "unk_token", None)  # WordPiece, BPE, WordLevel
    if unk is not None:
        return tokenizer.token_to_id(unk)
    if type(tokenizer.model).__name__ == "Unigram":  # which keeps an id, shown only in its state
        found = json.loads(tokenizer.model.__getstate__()).get("unk_id")
        return found if isinstance(found, int) else None
    return None


def id_twin(tokenizer: Any, vocab_size: int):  # -> tokenizers.Tokenizer
    """A twin of ``tokenizer`` whose words are token ids in decimal (pre-tokenized input):
    the same special tokens, added by the same post-processor, for the same truncation."""
    from tokenizers import Tokenizer, models

    twin = Tokenizer(models.WordLevel({str(i): i for i in range(vocab_size)}, unk_token="0"))
    twin.post_processor = tokenizer.post_processor
    return twin


def _from_json(path: str, do_lower_case: bool):  # -> tokenizers.Tokenizer
    """The tokenizer of ``path``; ``do_lower_case`` overrides its case setting where it has
    BERT's normalizer, whose setting it is (other normalizers are the model's own)."""
    from tokenizers import Tokenizer, models, normalizers

    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise ModelFileError(f"cannot read {path}: {exc}") from exc
    if isinstance(tokenizer.model, models.Unigram):
        tokenizer.model = _unigram(path)
    normalizer = tokenizer.normalizer
    if isinstance(normalizer, normalizers.BertNormalizer) and normalizer.lowercase != do_lower_case:
        normalizer.lowercase = do_lower_case
        tokenizer.normalizer = normalizer
    return tokenizer


def _unigram(path: str):  # -> tokenizers.models.Unigram
    """``path``'s Unigram model with its scores read by Python's JSON parser, as Hugging Face's
    tokenizers (transformers 5) read them: the library's own reader can be a unit in the last
    place off, which decides exact ties between segmentations (``0`` + ``00000`` against
    ``00000`` + ``0`` in ``425000000``)."""
    from tokenizers import models

    with open(path, encoding="utf-8") as f:
        model = json.load(f)["model"]
    vocab = [(token, score) for token, score in model["vocab"]]
    return models.Unigram(vocab, model.get("unk_id"), model.get("byte_fallback", False))


def _bert_tokenizer(vocab_path: str, do_lower_case: bool):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    try:
        wordpiece = models.WordPiece.from_file(vocab_path, unk_token=UNK, max_input_chars_per_word=100)
    except Exception as exc:
        raise ModelFileError(f"cannot read vocabulary {vocab_path}: {exc}") from exc
    tokenizer = Tokenizer(wordpiece)
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=do_lower_case
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls_id, sep_id, unk = (tokenizer.token_to_id(t) for t in (CLS, SEP, UNK))
    if cls_id is None or sep_id is None or unk is None:
        raise ModelFileError(f"{vocab_path} lacks one of [CLS], [SEP], [UNK], which BERT's vocabulary holds")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )
    return tokenizer
