"""``bertserve export``: the optimized graph as a TensorFlow SavedModel.

The export is the graph a worker runs: built from the model directory and options exactly as
the :class:`~.encoder.Encoder` builds it (frozen, pruned above the deepest pooled layer, cast
to fp16 or bf16 on request, pooling and normalization inside), so TF Serving, Triton or
``tf.saved_model.load`` serve the same vectors. Its ``serving_default`` signature takes
``input_ids``, ``input_mask`` and ``segment_ids`` (int32, ``[batch, length]``) and returns
``embeddings``. The tokenizer travels as assets (``vocab.txt``, and ``tokenizer.json`` when
the model has one) with ``bertserve.json``, which says how to tokenize: lower-casing, the
longest input, the pooling.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

from ..config.model import ModelConfig
from .default import default_graph_dir
from .graph import INPUT_NAMES, load_or_build, wrap_graph
from .model_dir import inspect_model

SIGNATURE = "serving_default"
OUTPUT_KEY = "embeddings"
DESCRIPTION = "bertserve.json"


def export_saved_model(options: ModelConfig, out: str) -> dict[str, Any]:
    """Write the SavedModel for ``options`` to ``out`` (which must not exist, or be empty);
    returns what ``bertserve.json`` says."""
    from ..logs import held_native_output
    from .options import build_tokenizer, describe, resolve

    with held_native_output():  # TensorFlow's libraries log as they load
        import tensorflow as tf

    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise FileExistsError(f"{out} exists and is not an empty directory")
    model = inspect_model(options)
    config, spec = resolve(options, model)
    tokenizer = build_tokenizer(model, config)
    graph_bytes, meta, _ = load_or_build(model, spec, config.graph_dir or default_graph_dir())
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(graph_bytes)
    graph_fn = wrap_graph(graph_def, meta)  # the weights stay constants, so the SavedModel holds them
    signature = [tf.TensorSpec([None, None], tf.int32, name=name) for name in INPUT_NAMES]
    description = {
        **describe(config, spec),
        "model_dir": os.path.abspath(config.model_dir),
        "output_dim": meta.output_dim,
        "token_level": meta.token_level,
        "layers_run": meta.layers_run,
        "max_len": tokenizer.max_len,
        "inputs": list(INPUT_NAMES),
        "output": OUTPUT_KEY,
    }
    staging = tempfile.mkdtemp(prefix="bertserve-export-")
    try:
        module = tf.Module()
        module.assets = [tf.saved_model.Asset(path) for path in _asset_files(model, staging, description)]

        @tf.function(input_signature=signature)
        def serve(input_ids: tf.Tensor, input_mask: tf.Tensor, segment_ids: tf.Tensor) -> dict[str, tf.Tensor]:
            return {OUTPUT_KEY: graph_fn(input_ids, input_mask, segment_ids)}

        module.serve = serve
        tf.saved_model.save(module, out, signatures={SIGNATURE: serve.get_concrete_function()})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return description


def _asset_files(model: Any, staging: str, description: dict[str, Any]) -> list[str]:
    """The tokenizer's files and ``bertserve.json``, copied under their usual names."""
    files = []
    for source, name in ((model.vocab_path, "vocab.txt"), (model.tokenizer_json, "tokenizer.json")):
        if source:
            target = os.path.join(staging, name)
            shutil.copyfile(source, target)
            files.append(target)
    target = os.path.join(staging, DESCRIPTION)
    with open(target, "w", encoding="utf-8") as f:
        json.dump(description, f, indent=2, sort_keys=True)
    files.append(target)
    return files
