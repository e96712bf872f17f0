"""Python code generated from Text Embeddings Inference's own ``tei.proto`` (a copy of the
published file, tests/data/tei), the way a TEI user makes a client: ``grpc_tools.protoc``.
Once a process, into a folder of its own put on ``sys.path``; the modules are ``tei_pb2`` and
``tei_pb2_grpc``, as protoc names them. protoc runs in a process of its own, as its users run it
(in the test's process it can crash once other protobuf code has loaded)."""

from __future__ import annotations

import functools
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

PROTO = Path(__file__).resolve().parent / "data" / "tei" / "tei.proto"


@functools.cache
def tei_stubs() -> tuple[ModuleType, ModuleType]:
    """(``tei_pb2``, ``tei_pb2_grpc``) generated from TEI's file."""
    out = tempfile.mkdtemp(prefix="tei-stubs-")
    _protoc(f"-I{PROTO.parent}", f"--python_out={out}", f"--grpc_python_out={out}", PROTO.name)
    sys.path.insert(0, out)
    return importlib.import_module("tei_pb2"), importlib.import_module("tei_pb2_grpc")


def generated(proto: Path, out: Path) -> Path:
    """``proto``'s Python modules generated into ``out`` (as the shipped stubs are), and ``out``."""
    _protoc(f"-I{proto.parent}", f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", proto.name)
    return out


def _protoc(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"protoc {' '.join(args)} failed: {done.stderr}"
