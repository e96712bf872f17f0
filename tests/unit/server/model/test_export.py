"""``bertserve export``: the SavedModel serves the ``Encoder``'s vectors, read back with
``tf.saved_model.load`` as TF Serving would."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bertserve.server.cli import main as cli
from bertserve.server.model.encoder import Encoder

TEXTS = [
    "First do it",
    "then do it right",
    "a longer sentence, with punctuation and some rarer words: zephyr quixotic",
    "x",
    "first sentence of a pair ||| and its second sentence",
]


def serve(saved: Path, encoder: Encoder, texts: list[str]) -> np.ndarray:
    import tensorflow as tf

    batch = encoder.tokenize(texts)
    signature = tf.saved_model.load(str(saved)).signatures["serving_default"]
    inputs = {"input_ids": batch.input_ids, "input_mask": batch.input_mask, "segment_ids": batch.segment_ids}
    return signature(**{name: tf.constant(value) for name, value in inputs.items()})["embeddings"].numpy()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.mark.parametrize(
    "options", [[], ["--pooling-strategy", "CLS_TOKEN", "--pooling-layer", "-1", "--dtype", "bf16", "--normalize"]]
)
def test_the_export_serves_the_encoders_vectors(
    tiny_hf: str, session_graph_dir: str, tmp_path: Path, options: list[str]
) -> None:
    out = tmp_path / "saved"
    argv = ["export", "--out", str(out), "--model-dir", tiny_hf, "--graph-dir", session_graph_dir, *options]
    assert cli.main(argv) == 0
    args = cli.build_parser().parse_args(argv)
    encoder = Encoder(cli.model_config_from_args(args))
    want = encoder.encode(TEXTS)
    got = serve(out, encoder, TEXTS)
    assert got.shape == want.shape
    assert cosines(got, want).min() >= 0.99999
    description = json.loads((out / "assets" / "bertserve.json").read_text())
    assert description["output_dim"] == encoder.output_dim and description["dtype"] == encoder.spec.dtype
    assert {p.name for p in (out / "assets").iterdir()} >= {"vocab.txt", "bertserve.json"}


def test_export_refuses_a_directory_that_holds_files(
    tiny_google: str, session_graph_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    argv = ["export", "--out", str(tmp_path), "--model-dir", tiny_google, "--graph-dir", session_graph_dir]
    assert cli.main(argv) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "mine"


@pytest.mark.minilm
def test_the_export_of_minilm_serves_the_encoders_vectors(
    minilm: str, session_graph_dir: str, tmp_path: Path, reference_sentences: list[str]
) -> None:
    out = tmp_path / "saved"
    argv = [
        "export",
        "--out",
        str(out),
        "--model-dir",
        minilm,
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        "128",
    ]
    assert cli.main(argv) == 0
    encoder = Encoder(minilm, graph_dir=session_graph_dir, max_seq_len=128)
    texts = reference_sentences[:64]
    assert cosines(serve(out, encoder, texts), encoder.encode(texts)).min() >= 0.99999
