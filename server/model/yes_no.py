"""A causal language model as a reranker (Qwen3-Reranker): a query and a document written into
the model's chat template, and the relevance read from its next-token logits for "yes" and
"no" at the last token.

The template and the way it is cut are those of Qwen3-Reranker's model card (its files carry
neither)::

    <|im_start|>system
    Judge whether the Document meets the requirements based on the Query and the Instruct
    provided. Note that the answer can only be "yes" or "no".<|im_end|>
    <|im_start|>user
    <Instruct>: {instruction}
    <Query>: {query}
    <Document>: {document}<|im_end|>
    <|im_start|>assistant
    <think>

    </think>

The part from ``<Instruct>`` to the document is one text, tokenized whole and cut on its
right to what the model's length leaves; the system turn before it and the assistant's turn
after it are always kept whole, as the special tokens of any other model are: here they are
the post-processor's (:func:`template_processor`). The score is softmax over the two logits,
the probability of "yes": sigmoid(logit(yes) - logit(no)), and the graph's output is that
difference (:mod:`.task_heads`), which the rerank answer turns into a probability as a
cross-encoder's sigmoid is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ModelError, ModelFileError
from .json_file import read_json

SYSTEM = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
BODY = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
ANSWERS = ("yes", "no")


@dataclass(frozen=True)
class PairTemplate:
    """How a (query, document) pair is written for the model: ``prefix`` and ``suffix`` kept
    whole around ``body``, which is cut."""

    prefix: str = SYSTEM
    suffix: str = ASSISTANT
    body: str = BODY
    instruction: str = INSTRUCTION

    def text(self, query: str, document: str) -> str:
        return self.body.format(instruction=self.instruction, query=query, document=document)


QWEN3_RERANKER = PairTemplate()


def answer_ids(model_dir: str) -> tuple[int, int]:
    """The ids of the tokens "yes" and "no" in the model's ``tokenizer.json``."""
    path = f"{model_dir}/tokenizer.json"
    try:
        vocab = read_json(path).get("model", {}).get("vocab")
    except (OSError, ModelFileError) as exc:
        raise ModelError(f"a yes/no reranker needs its tokenizer.json, to find the tokens yes and no: {exc}") from None
    if not isinstance(vocab, dict):
        raise ModelError(f"{path} has no vocabulary to find the tokens yes and no in")
    found: list[int] = []
    for word in ANSWERS:
        token_id = vocab.get(word)
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise ModelError(f"{path}: the reranker answers yes or no, and its vocabulary has no token {word!r}")
        found.append(token_id)
    return found[0], found[1]


def template_processor(tokenizer: Any, template: PairTemplate) -> Any:
    """A post-processor that puts ``template``'s prefix and suffix, tokenized by ``tokenizer``
    without special tokens, around every input, as special tokens that truncation keeps."""
    from tokenizers import processors

    def part(text: str) -> dict[str, Any]:
        encoding = tokenizer.encode(text, add_special_tokens=False)
        return {"ids": list(encoding.ids), "tokens": list(encoding.tokens)}

    prefix, suffix = part(template.prefix), part(template.suffix)
    return processors.TemplateProcessing(
        single="[PREFIX] $A [SUFFIX]",
        pair="[PREFIX] $A $B:1 [SUFFIX]",
        special_tokens=[{"id": "[PREFIX]", **prefix}, {"id": "[SUFFIX]", **suffix}],
    )
