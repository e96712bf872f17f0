"""Reading model directories: layouts, file-name overrides, and errors that name their cause."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from bertserve.server import ModelConfig, ModelFileError, ModelShapeError
from bertserve.server.model.model_dir import detect_layout, inspect_model, pooling_config
from bertserve.server.model.weights import read_weights
from bertserve.server.testing import tiny_bert

DISTILBERT = Path(__file__).resolve().parents[3] / "data" / "families" / "distilbert"


def _inspect(model_dir: str, **options: object):
    return inspect_model(ModelConfig.of(model_dir=model_dir, **options))


def test_layouts_are_detected(tiny_google: str, tiny_hf: str) -> None:
    assert detect_layout(tiny_google) == "google"
    assert detect_layout(tiny_hf) == "huggingface"
    google, hf = _inspect(tiny_google), _inspect(tiny_hf)
    assert google.config == hf.config
    assert google.do_lower_case and hf.do_lower_case
    a, b = read_weights(google), read_weights(hf)
    assert a.keys() == b.keys()
    assert all((a[name] == b[name]).all() for name in a)


def test_missing_directory_and_files_are_named(tmp_path, tiny_google: str) -> None:
    with pytest.raises(ModelFileError, match="does not exist"):
        _inspect(str(tmp_path / "nope"))
    with pytest.raises(ModelFileError, match="is not a model directory"):
        _inspect(str(tmp_path))
    broken = shutil.copytree(tiny_google, tmp_path / "broken")
    os.remove(broken / "vocab.txt")
    with pytest.raises(ModelFileError, match=r"missing file .*broken/vocab\.txt"):
        _inspect(str(broken))
    shutil.copy(os.path.join(tiny_google, "vocab.txt"), broken / "vocab.txt")
    os.remove(broken / "bert_model.ckpt.index")
    with pytest.raises(ModelFileError, match=r"bert_model\.ckpt\.index"):
        _inspect(str(broken))


def test_unreadable_and_malformed_files(tmp_path, tiny_hf: str) -> None:
    broken = shutil.copytree(tiny_hf, tmp_path / "broken")
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelFileError, match=r"config\.json is not valid JSON"):
        _inspect(str(broken))
    shutil.copy(os.path.join(tiny_hf, "config.json"), broken / "config.json")
    (broken / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(ModelFileError, match=r"cannot read .*model\.safetensors"):
        read_weights(_inspect(str(broken)))
    (broken / "config.json").write_text('{"hidden_size": 32}')
    with pytest.raises(ModelFileError, match="missing or non-integer vocab_size"):
        _inspect(str(broken))


def test_pytorch_only_directory_says_how_to_convert(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelFileError, match=r"only PyTorch weights .* safetensors.*save_file"):
        _inspect(str(tmp_path))


def test_missing_layers_are_reported(tmp_path, tiny_hf: str) -> None:
    broken = shutil.copytree(tiny_hf, tmp_path / "broken")
    text = (broken / "config.json").read_text().replace('"num_hidden_layers": 3', '"num_hidden_layers": 4')
    (broken / "config.json").write_text(text)
    with pytest.raises(ModelShapeError, match=r"lack bert/encoder/layer_3/.*config says 4 layers"):
        read_weights(_inspect(str(broken)))


def test_file_names_can_be_overridden(tmp_path) -> None:
    config, weights = tiny_bert.make_weights(seed=1)
    directory = str(tmp_path / "renamed")
    tiny_bert.write_google_checkpoint(directory, config, weights, ckpt_name="model.ckpt-5", config_name="cfg.json")
    os.rename(os.path.join(directory, "vocab.txt"), os.path.join(directory, "words.txt"))
    model = _inspect(directory, ckpt_name="model.ckpt-5", config_name="cfg.json", vocab_name="words.txt")
    assert model.vocab_path.endswith("words.txt")
    assert set(read_weights(model)) == set(weights)


def test_hf_names_with_bert_prefix_are_read(tmp_path, tiny_hf: str) -> None:
    from safetensors.numpy import load_file, save_file

    prefixed = shutil.copytree(tiny_hf, tmp_path / "prefixed")
    tensors = load_file(str(prefixed / "model.safetensors"))
    save_file({f"bert.{name}": value for name, value in tensors.items()}, str(prefixed / "model.safetensors"))
    a, b = read_weights(_inspect(tiny_hf)), read_weights(_inspect(str(prefixed)))
    assert all((a[name] == b[name]).all() for name in a)


def test_cased_vocabulary_is_detected(tmp_path) -> None:
    config, weights = tiny_bert.make_weights(seed=1)
    directory = str(tmp_path / "cased")
    tiny_bert.write_google_checkpoint(directory, config, weights)
    path = os.path.join(directory, "vocab.txt")
    with open(path, encoding="utf-8") as f:
        tokens = f.read().split("\n")
    capitalised = [token.capitalize() if token.isalpha() else token for token in tokens]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(capitalised))
    assert not _inspect(directory).do_lower_case
    assert _inspect(directory, do_lower_case=True).do_lower_case


# -- files named by the model's own JSON stay inside its directory ---------------------------

SECRET = "s3cr3t-of-another-file"


def _st_model(tmp_path: Path) -> Path:
    """A tiny sentence-transformers model, and beside it (outside it) a Pooling config."""
    model = tmp_path / "model"
    tiny_bert.write_tiny_bert(str(model), "huggingface", seed=1, tokenizer_json=True, sentence_transformers=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "config.json").write_text(json.dumps({"pooling_mode": SECRET}))
    return model


def _set_module_path(model: Path, index: int, path: str) -> None:
    modules = json.loads((model / "modules.json").read_text())
    modules[index]["path"] = path
    (model / "modules.json").write_text(json.dumps(modules))


@pytest.mark.parametrize("how", ["parent", "absolute", "through a folder"])
def test_a_module_leading_out_of_the_model_directory_is_refused_unread(tmp_path: Path, how: str) -> None:
    model = _st_model(tmp_path)
    outside = tmp_path / "outside"
    declared = {"parent": "../outside", "absolute": str(outside), "through a folder": "1_Pooling/../../outside"}[how]
    _set_module_path(model, 1, declared)
    for read in (lambda: _inspect(str(model)), lambda: pooling_config(str(model))):
        with pytest.raises(
            ModelFileError, match=r"module 1 \(Pooling\) with path '[^']*outside' leads outside the model directory"
        ) as refused:
            read()
        assert SECRET not in str(refused.value)


@pytest.mark.parametrize("how", ["folder", "file"])
def test_a_model_directory_of_links_is_its_owners_and_is_read(tmp_path: Path, how: str) -> None:
    """Links are the directory owner's, not the model's JSON: followed, as for every file."""
    model = _st_model(tmp_path)
    shared = tmp_path / "shared"
    shutil.move(model / "1_Pooling", shared)
    if how == "folder":
        (model / "1_Pooling").symlink_to(shared, target_is_directory=True)
    else:
        (model / "1_Pooling").mkdir()
        (model / "1_Pooling" / "config.json").symlink_to(shared / "config.json")
    assert _inspect(str(model)).defaults.pooling_strategy.name == "REDUCE_MEAN"


def test_a_dense_module_out_of_the_model_directory_is_refused(tmp_path: Path) -> None:
    model = shutil.copytree(DISTILBERT, tmp_path / "model")
    shutil.move(model / "2_Dense", tmp_path / "dense")
    _set_module_path(model, 2, "../dense")
    with pytest.raises(ModelFileError, match=r"module 2 \(Dense\) with path '\.\./dense' leads outside"):
        _inspect(str(model))


def test_a_shard_out_of_the_model_directory_is_refused(tmp_path: Path, tiny_hf: str) -> None:
    model = shutil.copytree(tiny_hf, tmp_path / "model")
    (tmp_path / "outside").mkdir()
    shutil.move(model / "model.safetensors", tmp_path / "outside" / "model.safetensors")
    index = {"metadata": {}, "weight_map": {"embeddings.word_embeddings.weight": "../outside/model.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelFileError, match=r"the shard '\.\./outside/model\.safetensors' leads outside"):
        _inspect(str(model))


def test_links_in_the_model_directory_and_a_hub_snapshot_are_read(tmp_path: Path) -> None:
    model = _st_model(tmp_path)
    # The Hub cache's layout: each file of a snapshot a relative link to the repository's blobs.
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / ("c" * 40)
    (repo / "blobs").mkdir(parents=True)
    for source in sorted(model.rglob("*")):
        if source.is_file():
            relative = source.relative_to(model)
            blob = repo / "blobs" / str(relative).replace(os.sep, "_")
            shutil.copy(source, blob)
            link = snapshot / relative
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    assert _inspect(str(snapshot)).defaults.pooling_strategy.name == "REDUCE_MEAN"
    # A module folder linked to another folder of the model directory is its own.
    (model / "1_Pooling").rename(model / "pooling")
    (model / "1_Pooling").symlink_to("pooling", target_is_directory=True)
    assert _inspect(str(model)).defaults.pooling_strategy.name == "REDUCE_MEAN"
