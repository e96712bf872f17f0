"""The .pt reader: the real files torch.save wrote (tests/data/multivector/bge_m3/) read as
torch.load reads them, and hostile files refused with nothing run. No torch here."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from bertserve.server.errors import ModelFileError
from bertserve.server.model.torch_files import read_torch_tensors

DATA = Path(__file__).resolve().parents[3] / "data" / "multivector"


@pytest.mark.parametrize("head", ["sparse_linear", "colbert_linear"])
def test_reads_the_heads_torch_saved(head: str) -> None:
    reference = np.load(DATA / "bge_m3.npz")
    tensors = read_torch_tensors(str(DATA / "bge_m3" / f"{head}.pt"))
    assert list(tensors) == ["weight", "bias"]
    for name, value in tensors.items():
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, reference[f"{head}_{name}"])


# -- files written here, the pickle by hand with the opcodes torch.save writes ------------------


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _str(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _int(value: int) -> bytes:
    return b"J" + struct.pack("<i", value)


def _ints(values: tuple[int, ...]) -> bytes:
    return b"(" + b"".join(_int(v) for v in values) + b"t"


def _tensor(storage_type: str, key: str, numel: int, offset: int, size: tuple, stride: tuple) -> bytes:
    storage = b"(" + _str("storage") + _global("torch", storage_type) + _str(key) + _str("cpu") + _int(numel) + b"tQ"
    hooks = _global("collections", "OrderedDict") + b")R"
    arguments = b"(" + storage + _int(offset) + _ints(size) + _ints(stride) + b"\x89" + hooks + b"t"
    return _global("torch._utils", "_rebuild_tensor_v2") + arguments + b"R"


def _state_dict(items: dict[str, bytes]) -> bytes:
    body = b"".join(_str(name) + value for name, value in items.items())
    return b"\x80\x02" + _global("collections", "OrderedDict") + b")R(" + body + b"u."


def _write(path: Path, pickled: bytes, storages: dict[str, bytes], byteorder: bytes = b"little") -> str:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", byteorder)
        for key, raw in storages.items():
            archive.writestr(f"archive/data/{key}", raw)
    return str(path)


def test_strides_offsets_and_dtypes(tmp_path: Path) -> None:
    floats = np.arange(12, dtype="<f4")
    longs = np.arange(10, dtype="<i8")
    halves = np.arange(6, dtype="<f2")
    bf16 = (np.arange(4, dtype="<f4").view("<u4") >> 16).astype("<u2")  # bfloat16: the top half of a float32
    pickled = _state_dict(
        {
            "transposed": _tensor("FloatStorage", "0", 12, 0, (4, 3), (1, 4)),
            "slice": _tensor("LongStorage", "1", 10, 2, (5,), (1,)),
            "half": _tensor("HalfStorage", "2", 6, 0, (2, 3), (3, 1)),
            "bf16": _tensor("BFloat16Storage", "3", 4, 0, (4,), (1,)),
            "empty": _tensor("FloatStorage", "0", 12, 0, (0, 3), (3, 1)),
        }
    )
    raw = {"0": floats.tobytes(), "1": longs.tobytes(), "2": halves.tobytes(), "3": bf16.tobytes()}
    tensors = read_torch_tensors(_write(tmp_path / "t.pt", pickled, raw))
    np.testing.assert_array_equal(tensors["transposed"], floats.reshape(3, 4).T)
    np.testing.assert_array_equal(tensors["slice"], longs[2:7])
    np.testing.assert_array_equal(tensors["half"], halves.reshape(2, 3))
    np.testing.assert_array_equal(tensors["bf16"].astype(np.float32), np.arange(4, dtype=np.float32))
    assert tensors["empty"].shape == (0, 3)
    assert tensors["transposed"].flags.writeable and tensors["transposed"].flags.c_contiguous


# -- hostile files -------------------------------------------------------------------------------


def _calling(module: str, name: str, argument: str) -> bytes:
    """A pickle whose loading calls module.name(argument)."""
    return b"\x80\x02" + _global(module, name) + b"(" + _str(argument) + b"tR."


@pytest.mark.parametrize(("module", "name"), [("os", "system"), ("builtins", "exec"), ("builtins", "eval")])
def test_refuses_a_global_off_the_list_and_runs_nothing(tmp_path: Path, module: str, name: str) -> None:
    marker = tmp_path / "ran"
    command = f"touch {marker}" if module == "os" else f"open({str(marker)!r}, 'w').close()"
    path = _write(tmp_path / "evil.pt", _calling(module, name, command), {})
    with pytest.raises(ModelFileError, match=rf"evil\.pt.*{module}\.{name}"):
        read_torch_tensors(path)
    assert not marker.exists()


def test_refuses_an_unknown_global_inside_a_state_dict(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = _global("posix", "system") + b"(" + _str(f"touch {marker}") + b"tR"
    path = _write(tmp_path / "evil.pt", _state_dict({"weight": evil}), {})
    with pytest.raises(ModelFileError, match=r"posix\.system"):
        read_torch_tensors(path)
    assert not marker.exists()


def test_refuses_a_storage_key_outside_the_archive(tmp_path: Path) -> None:
    pickled = _state_dict({"weight": _tensor("FloatStorage", "../../etc/passwd", 4, 0, (4,), (1,))})
    path = _write(tmp_path / "keys.pt", pickled, {"0": bytes(16)})
    with pytest.raises(ModelFileError, match=r"keys\.pt.*storage key '\.\./\.\./etc/passwd'"):
        read_torch_tensors(path)


def test_refuses_a_missing_storage(tmp_path: Path) -> None:
    pickled = _state_dict({"weight": _tensor("FloatStorage", "7", 4, 0, (4,), (1,))})
    with pytest.raises(ModelFileError, match=r"archive/data/7, which the archive does not hold"):
        read_torch_tensors(_write(tmp_path / "m.pt", pickled, {"0": bytes(16)}))


def test_refuses_a_truncated_storage(tmp_path: Path) -> None:
    pickled = _state_dict({"weight": _tensor("FloatStorage", "0", 4, 0, (4,), (1,))})
    with pytest.raises(ModelFileError, match=r"archive/data/0 of 4 FloatStorage elements, past its 10 bytes"):
        read_torch_tensors(_write(tmp_path / "short.pt", pickled, {"0": bytes(10)}))


@pytest.mark.parametrize(
    ("offset", "size", "stride"),
    [(1, (4,), (1,)), (0, (2, 3), (3, 1)), (0, (2, 2), (1, 3))],
)
def test_refuses_a_tensor_past_its_storage(tmp_path: Path, offset: int, size: tuple, stride: tuple) -> None:
    pickled = _state_dict({"weight": _tensor("FloatStorage", "0", 4, offset, size, stride)})
    with pytest.raises(ModelFileError, match=r"storage 0"):
        read_torch_tensors(_write(tmp_path / "past.pt", pickled, {"0": bytes(16)}))


def test_refuses_a_legacy_file(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pt"
    path.write_bytes(b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.")  # the legacy format's magic number, pickled
    with pytest.raises(ModelFileError, match=r"legacy\.pt is not a zip archive.*legacy format"):
        read_torch_tensors(str(path))


def test_refuses_a_zip_that_is_not_torchs(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(ModelFileError, match=r"other\.pt.*no <archive>/data\.pkl"):
        read_torch_tensors(str(path))


def test_refuses_a_big_endian_file(tmp_path: Path) -> None:
    pickled = _state_dict({"weight": _tensor("FloatStorage", "0", 4, 0, (4,), (1,))})
    with pytest.raises(ModelFileError, match=r"big-endian"):
        read_torch_tensors(_write(tmp_path / "be.pt", pickled, {"0": bytes(16)}, byteorder=b"big"))


def test_refuses_a_state_dict_of_something_else(tmp_path: Path) -> None:
    pickled = _state_dict({"weight": _str("not a tensor")})
    with pytest.raises(ModelFileError, match=r"holds 'weight': str, not a tensor"):
        read_torch_tensors(_write(tmp_path / "str.pt", pickled, {}))


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"cannot read .*absent\.pt"):
        read_torch_tensors(str(tmp_path / "absent.pt"))
