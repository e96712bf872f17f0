"""``bertserve calibrate``: the ranges of a model's dimensions over a file of sentences, written
where the workers find them and read back, checked, with the model; a damaged file is refused
with what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bertserve.server import Encoder
from bertserve.server.cli.main import main
from bertserve.server.errors import ModelFileError
from bertserve.server.model.calibration import read_calibration

MODEL = Path(__file__).resolve().parents[3] / "data" / "families" / "roberta"
SENTENCES = Path(__file__).resolve().parents[3] / "data" / "sentences.json"

pytestmark = pytest.mark.timeout(300)


def test_calibrate_writes_the_ranges_the_model_then_carries(tmp_path: Path, session_graph_dir: str) -> None:
    sentences = json.loads(SENTENCES.read_text(encoding="utf-8"))[:40]
    lines = tmp_path / "sentences.txt"
    lines.write_text("\n".join(sentences) + "\n\n", encoding="utf-8")
    out = tmp_path / "calibration.json"
    flags = ["--model-dir", str(MODEL), "--graph-dir", session_graph_dir, "--dtype", "fp32", "--out", str(out)]
    assert main(["calibrate", str(lines), *flags]) == 0
    written = json.loads(out.read_text())
    assert written["count"] == 40 and written["dim"] == 32
    encoder = Encoder(MODEL, dtype="fp32", graph_dir=session_graph_dir, calibration=str(out))
    vectors = encoder.encode(sentences)
    ranges = np.asarray(encoder.describe()["calibration_ranges"], np.float32)
    np.testing.assert_allclose(ranges, [vectors.min(axis=0), vectors.max(axis=0)], atol=1e-6)


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ({"min": [0.0] * 3, "max": [1.0] * 3}, "should list 32 numbers"),
        ({"min": [0.0] * 32}, "max should list"),
        ({"min": [1.0] * 32, "max": [0.0] * 32}, r"min\[0\] = 1\.0 and max\[0\] = 0\.0: min is above max"),
        ({"min": ["a"] * 32, "max": [1.0] * 32}, "finite numbers"),
        ([1, 2], "object"),
    ],
)
def test_a_damaged_calibration_file_is_refused_with_what_is_wrong(tmp_path: Path, content: object, names: str) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ModelFileError, match=names):
        read_calibration(str(path), 32)
    with pytest.raises(ModelFileError, match="bertserve calibrate"):
        read_calibration(str(tmp_path / "missing.json"), 32)


def _ranges(dimension: int, low: float, high: float) -> dict[str, list[float]]:
    """Sane ranges for 32 dimensions but ``dimension``'s."""
    content = {"min": [-1.0] * 32, "max": [1.0] * 32}
    content["min"][dimension], content["max"][dimension] = low, high
    return content


@pytest.mark.parametrize(
    ("content", "names"),
    [
        (_ranges(5, -1e300, 1.0), r"min\[5\] = -1e\+300 is beyond float32"),
        (_ranges(7, 0.0, 1e300), r"max\[7\] = 1e\+300 is beyond float32"),
        (_ranges(9, -3e38, 3e38), r"min\[9\] = -3e\+38 and max\[9\] = 3e\+38: max - min overflows float32"),
        (_ranges(11, 1.0, 1.00000001), r"min\[11\] = 1\.0 and max\[11\] = 1\.00000001: float32 cannot cut"),
        (_ranges(13, 0.0, 1e-44), r"min\[13\] = 0\.0 and max\[13\] = 1e-44: float32 cannot cut"),
        ({"min": [0] * 31 + [10**400], "max": [1] * 32}, "min should hold finite numbers only"),
    ],
    ids=["min beyond", "max beyond", "width overflows", "bounds alike", "width underflows", "int beyond"],
)
def test_ranges_that_hold_in_float64_only_are_refused_naming_the_entry(
    tmp_path: Path, content: object, names: str
) -> None:
    """Quantizing computes in float32: there these ranges make a dimension's int8 values all alike."""
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ModelFileError, match=names):
        read_calibration(str(path), 32)


def test_a_dimension_constant_over_the_calibration_set_is_kept(tmp_path: Path) -> None:
    """``bertserve calibrate`` writes min equal to max for it, and quantizing expects that."""
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(_ranges(3, 0.5, 0.5)))
    ranges = read_calibration(str(path), 32)
    assert ranges.dtype == np.float32 and ranges[:, 3].tolist() == [0.5, 0.5]
