"""The BERT variants that ship their own model code (``auto_map``), as ``make_family_references.py
--code CODE`` builds their tiny random models with that code: GTE's "new" model, NomicBERT and
JinaBERT, each made and run by its own published code under transformers 5
(:mod:`lib.transformers4` gives that code what transformers 5 dropped), then laid out as a model
downloaded from the Hub (:func:`as_downloaded`: no code, ``auto_map`` naming its repository).

    gte         GTE (gte-base-en-v1.5's shape): 3 layers, 4 heads, no token types, RoPE base 500 with
                NTK factor 2 (the real 500000 barely turns over 32 positions), Q, K and V packed,
                up/gate fused; BERT WordPiece; CLS pooling, no Normalize (as gte-base-en-v1.5)
    nomic_bert  NomicBERT (nomic-embed-text-v1.5's): 3 layers, 4 heads, SwiGLU with n_inner 64 (which its
                code rounds up to 256), rotary over half of each head (the real one: all of it),
                base 100 (1000), no biases, the vocabulary padded to a multiple of 64; mean pooling,
                Normalize; nomic's prompts (``search_query: ``...)
    jina_bert   JinaBERT (jina-embeddings-v2's): hidden 48, 3 layers, 6 heads (ALiBi's slopes for a
                head count that is not a power of two), GEGLU, 2 token types, pooler; mean pooling,
                Normalize

The code is not on PyPI; each family's comes from the Hub into one directory::

    hf download Alibaba-NLP/new-impl modeling.py configuration.py --local-dir CODE/gte
    hf download nomic-ai/nomic-bert-2048 modeling_hf_nomic_bert.py configuration_hf_nomic_bert.py \\
        --local-dir CODE/nomic_bert
    hf download jinaai/jina-bert-implementation modeling_bert.py configuration_bert.py --local-dir CODE/jina_bert

(NomicBERT's code needs einops.)
"""

from __future__ import annotations

import inspect
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

import lib.transformers4  # noqa: F401  (before any model code is imported)
from lib.reference_stack import Family, rewrite_json
from lib.variant_configs import CODE, JINA_V3_PROMPTS, NOMIC_PROMPTS, TINY

VARIANTS = (
    Family("gte", TINY["gte"], pooling="cls", normalize=False),
    Family("nomic_bert", TINY["nomic_bert"]),
    Family("jina_bert", TINY["jina_bert"]),
    Family("jina_v3", TINY["jina_v3"]),
)


def build(family: Family, code: Path, tokenizer: Any, out: Path) -> None:
    """The family's tiny random model, made by its own code, saved with sentence-transformers
    into ``out`` with ``tokenizer`` (and with the code, for the references to be computed
    from: :func:`as_downloaded` then leaves it out)."""
    torch.manual_seed(sum(map(ord, family.name)))
    _, config_class, model_class = CODE[family.name]
    with tempfile.TemporaryDirectory() as made, tempfile.TemporaryDirectory() as saved:
        for source in (code / family.name).glob("*.py"):
            shutil.copy(source, made)
        config = {**family.config, "vocab_size": len(tokenizer), "initializer_range": 0.2}
        config["auto_map"] = {"AutoConfig": config_class, "AutoModel": model_class}
        Path(made, "config.json").write_text(json.dumps(config))
        tokenizer.save_pretrained(made)
        loaded = transformers.AutoConfig.from_pretrained(made, trust_remote_code=True)
        model = transformers.AutoModel.from_config(loaded, trust_remote_code=True)
        with torch.no_grad():  # norms off 1, biases off 0: a reader that drops one is seen
            for name, parameter in model.named_parameters():
                if parameter.ndim == 1:
                    parameter.add_(0.1 * torch.randn_like(parameter))
                if "lora_" in name:  # each adapter starts as a no-op (one of its factors 0): made to matter
                    parameter.copy_(0.3 * torch.randn_like(parameter))
        model.save_pretrained(saved)
        tokenizer.save_pretrained(saved)
        for source in (code / family.name).glob("*.py"):
            shutil.copy(source, saved)
        remote = {"trust_remote_code": True}
        transformer = Transformer(saved, model_kwargs=remote, config_kwargs=remote, processor_kwargs=remote)
        hidden = transformer.get_embedding_dimension()
        modules: list[torch.nn.Module] = [transformer, Pooling(hidden, pooling_mode=family.pooling)]
        modules += [Normalize()] if family.normalize else []
        shutil.rmtree(out, ignore_errors=True)
        prompts = {"nomic_bert": NOMIC_PROMPTS, "jina_v3": JINA_V3_PROMPTS}.get(family.name)
        SentenceTransformer(modules=modules, device="cpu", prompts=prompts).save(str(out), create_model_card=False)
    for source in (code / family.name).glob("*.py"):
        shutil.copy(source, out)


def as_downloaded(out: Path, name: str) -> dict[str, Any]:
    """``out`` as a model downloaded from the Hub holds it: no code, ``auto_map`` naming the
    code's repository. Returns the config.json written."""
    repo = CODE[name][0]
    for source in out.glob("*.py"):
        source.unlink()

    def hub_auto_map(config: dict) -> dict:
        config["auto_map"] = {key: f"{repo}--{value}" for key, value in config["auto_map"].items()}
        return config

    rewrite_json(out / "config.json", hub_auto_map)
    if name == "jina_v3":  # its Transformer module is its own code's, which takes the task
        rewrite_json(out / "modules.json", _custom_transformer)
    return json.loads((out / "config.json").read_text())


def _custom_transformer(modules: list) -> list:
    first = {**modules[0], "name": "transformer", "type": "custom_st.Transformer", "kwargs": ["task"]}
    return [first, *modules[1:]]


def loaded(*args: Any, **kwargs: Any) -> SentenceTransformer:
    """SentenceTransformer, trusting the directory's code, its model answering hidden states."""
    model = SentenceTransformer(*args, trust_remote_code=True, **kwargs)
    _hidden_states(model[0].auto_model)
    return model


def _hidden_states(auto: Any) -> Any:
    """``auto`` answering ``output_hidden_states=True`` as transformers' models do, where its code
    does not (NomicBERT's): the embedding norm's output, then each layer's, taken by hooks."""
    forward = auto.forward
    if "output_hidden_states" in inspect.signature(forward).parameters or hasattr(auto, "roberta"):
        return auto  # (jina-embeddings-v3's LoRA wrapper passes it on to its XLM-RoBERTa)

    def with_states(*args: Any, output_hidden_states: bool = False, **kwargs: Any) -> Any:
        states: list[torch.Tensor] = []

        def keep(module: Any, inputs: Any, output: Any) -> None:
            states.append(output[0] if isinstance(output, tuple) else output)

        hooks = [auto.emb_ln.register_forward_hook(keep)]
        hooks += [layer.register_forward_hook(keep) for layer in auto.encoder.layers]
        try:
            output = forward(*args, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
        if output_hidden_states:
            output.hidden_states = tuple(states)
        return output

    auto.forward = with_states
    return auto


class Remote:
    """transformers as ``make_family_references`` uses it, its tokenizer loaded trusting the
    directory's code (which a BERT tokenizer does not need, but the config's auto_map asks)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(transformers, name)

    class AutoTokenizer:
        @staticmethod
        def from_pretrained(path: str) -> Any:
            return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=True)


def adapter_references(out: Path, sentences: list[str]) -> dict[str, Any]:
    """jina-embeddings-v3's vectors with each task's adapter, as its ``encode(task=...)`` gives
    them: the task's prompt before each sentence, and the adapter's LoRA on every product
    (``st_adapter_<i>``, i the task's place in ``lora_adaptations``)."""
    import numpy as np

    model = loaded(str(out), device="cpu")
    arrays = {}
    for index, (name, prompt) in enumerate(JINA_V3_PROMPTS.items()):
        with torch.inference_mode():
            features = model[0].preprocess([prompt + s for s in sentences])
            mask = torch.full((len(sentences),), index, dtype=torch.int32)
            features = model[0](features, adapter_mask=mask)
            for module in list(model)[1:]:
                features = module(features)
        arrays[f"st_adapter_{index}"] = features["sentence_embedding"].numpy().astype(np.float32)
        print(f"  jina_v3      adapter {index} ({name})", flush=True)
    return arrays
