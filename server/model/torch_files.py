"""Reading the tensors of a PyTorch ``.pt`` file (``torch.save(state_dict)``) without torch and
without running anything the file names: BGE-M3's ``sparse_linear.pt`` and ``colbert_linear.pt``.

The file is torch's zip format (torch 1.6 and later): ``<archive>/data.pkl`` pickles the state
dict, each tensor a call of ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
requires_grad, hooks)`` whose storage is a persistent id ``("storage", torch.<Type>Storage,
key, location, numel)`` naming the raw little-endian entry ``<archive>/data/<key>``.

The pickle is read by an unpickler that resolves only the globals such a file holds (below), each
to a function of this module that builds numpy arrays; any other global (``os.system``,
``builtins.eval``...) stops the reading with :class:`ModelFileError` before anything is imported
or called. A storage must lie inside its zip entry, a tensor inside its storage.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ModelFileError


@dataclass(frozen=True)
class _StorageType:
    name: str
    dtype: str  # numpy's, little-endian; "bfloat16" for torch's BFloat16Storage


_STORAGE_TYPES = {
    name: _StorageType(name, dtype)
    for name, dtype in {
        "FloatStorage": "<f4",
        "DoubleStorage": "<f8",
        "HalfStorage": "<f2",
        "BFloat16Storage": "bfloat16",
        "LongStorage": "<i8",
        "IntStorage": "<i4",
        "ShortStorage": "<i2",
        "CharStorage": "i1",
        "ByteStorage": "u1",
        "BoolStorage": "?",
    }.items()
}


@dataclass(frozen=True)
class _Storage:
    key: str
    array: np.ndarray  # 1-d, of the storage's dtype


def _rebuild_tensor(
    storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False, hooks: Any = None, *rest: Any
) -> np.ndarray:
    """``torch._utils._rebuild_tensor_v2``: the strided view of the storage, copied."""
    if not isinstance(storage, _Storage):
        raise _Refused(f"a tensor whose storage is a {type(storage).__name__}, not a storage of the archive")
    if not (_is_int(offset) and _ints(size) and _ints(stride) and len(size) == len(stride)):
        raise _Refused(f"a tensor of storage {storage.key} with a malformed offset, size or stride")
    if any(n < 0 for n in size) or any(s < 0 for s in stride) or offset < 0:
        raise _Refused(f"a tensor of storage {storage.key} with a negative offset, size or stride")
    if int(np.prod(size, dtype=np.int64)) > storage.array.size:
        raise _Refused(
            f"a tensor of storage {storage.key} with more elements than its storage (a state dict's do not overlap)"
        )
    if 0 not in size:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if last >= storage.array.size:
            raise _Refused(f"a tensor of storage {storage.key} reaching element {last} of {storage.array.size}")
        itemsize = storage.array.itemsize
        view = np.lib.stride_tricks.as_strided(
            storage.array[offset:],
            shape=tuple(size),
            strides=tuple(s * itemsize for s in stride),
            writeable=False,
        )
        return np.array(view, order="C")
    return np.zeros(tuple(size), storage.array.dtype)


def _rebuild_parameter(tensor: Any, requires_grad: Any = False, hooks: Any = None, *rest: Any) -> np.ndarray:
    """``torch._utils._rebuild_parameter``: a Parameter is its tensor here."""
    if not isinstance(tensor, np.ndarray):
        raise _Refused(f"a parameter of a {type(tensor).__name__}, not a tensor")
    return tensor


def _ordered_dict(*args: Any) -> collections.OrderedDict:
    return collections.OrderedDict(*args)


#: Every global a state dict of tensors pickles, and what it becomes here.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): storage_type for name, storage_type in _STORAGE_TYPES.items()},
}


_MAX_PICKLE = 64 << 20


class _Refused(Exception):
    """What the unpickler will not do; becomes a ModelFileError naming the file."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(values: Any) -> bool:
    return isinstance(values, tuple) and all(_is_int(v) for v in values)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(io.BytesIO(data))
        self._archive = archive
        self._prefix = prefix
        self._storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise _Refused(f"the global {module}.{name}, which a state dict of tensors does not hold")
        return found

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _Refused(f"a persistent id {str(pid)[:80]!r} that is not a storage")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType) or not isinstance(key, str) or not _is_int(numel):
            raise _Refused(f"a malformed storage id {str(pid)[:80]!r}")
        if key not in self._storages:
            self._storages[key] = self._read_storage(storage_type, key, numel)
        return self._storages[key]

    def _read_storage(self, storage_type: _StorageType, key: str, numel: int) -> _Storage:
        if not key.isalnum():
            raise _Refused(f"the storage key {key!r}, which names no entry under {self._prefix}data/")
        entry = f"{self._prefix}data/{key}"
        try:
            info = self._archive.getinfo(entry)
        except KeyError:
            raise _Refused(f"the storage {entry}, which the archive does not hold") from None
        dtype = _dtype(storage_type)
        wanted = numel * dtype.itemsize
        if numel < 0 or wanted > info.file_size:
            raise _Refused(
                f"the storage {entry} of {numel} {storage_type.name} elements, past its {info.file_size} bytes"
            )
        with self._archive.open(info) as f:  # no more than the storage: a compressed entry cannot inflate past it
            raw = f.read(wanted)
        if len(raw) != wanted:
            raise _Refused(f"the storage {entry}, cut short at {len(raw)} of {wanted} bytes")
        return _Storage(key, np.frombuffer(raw, dtype, count=numel))


def _dtype(storage_type: _StorageType) -> np.dtype:
    if storage_type.dtype == "bfloat16":
        import ml_dtypes  # TensorFlow's own dependency

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(storage_type.dtype)


def read_torch_tensors(path: str) -> dict[str, np.ndarray]:
    """The tensors of the state dict that ``torch.save`` wrote to ``path``, by name, as numpy
    arrays (bfloat16 as ``ml_dtypes.bfloat16``); :class:`ModelFileError` naming the file for a
    file that is not torch's zip format, holds anything but tensors, or is malformed."""
    try:
        with zipfile.ZipFile(path) as archive:
            data_entry = _data_entry(path, archive)
            prefix = data_entry[: -len("data.pkl")]
            _check_byteorder(path, archive, prefix)
            with archive.open(data_entry) as f:
                data = f.read(_MAX_PICKLE + 1)
            if len(data) > _MAX_PICKLE:
                raise ModelFileError(
                    f"{path}: {data_entry} is over {_MAX_PICKLE} bytes, more than a state dict's names"
                )
            result = _Unpickler(data, archive, prefix).load()
    except zipfile.BadZipFile as exc:
        raise ModelFileError(
            f"{path} is not a zip archive: only torch.save's zip format (torch 1.6 and later) is read, "
            "not the legacy format; save it again with a recent torch"
        ) from exc
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except _Refused as exc:
        raise ModelFileError(f"{path}: refused {exc}") from exc
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise ModelFileError(f"{path} is not a readable torch state dict: {exc}") from exc
    return _tensors(path, result)


def _data_entry(path: str, archive: zipfile.ZipFile) -> str:
    entries = [name for name in archive.namelist() if name.endswith("/data.pkl") and name.count("/") == 1]
    if len(entries) != 1:
        raise ModelFileError(f"{path} is a zip archive but not torch's: it has no <archive>/data.pkl")
    return entries[0]


def _check_byteorder(path: str, archive: zipfile.ZipFile, prefix: str) -> None:
    try:
        order = archive.read(f"{prefix}byteorder").decode("ascii", "replace").strip()
    except KeyError:
        return  # written before torch 1.10's byteorder record: little-endian
    if order != "little":
        raise ModelFileError(f"{path} was saved {order}-endian; only little-endian files are read")


def _tensors(path: str, result: Any) -> dict[str, np.ndarray]:
    if not isinstance(result, dict):
        raise ModelFileError(f"{path} holds a {type(result).__name__}, not a state dict of tensors")
    tensors: dict[str, np.ndarray] = {}
    for name, value in result.items():
        if not isinstance(name, str) or not isinstance(value, np.ndarray) or value.dtype == object:
            raise ModelFileError(f"{path} holds {name!r}: {type(value).__name__}, not a tensor")
        tensors[name] = value
    return tensors
