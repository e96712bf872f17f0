"""Python code generated from Text Embeddings Inference's own ``tei.proto`` (a copy of the
published file, tests/data/tei), the way a TEI user makes a client: ``grpc_tools.protoc``.
Once a process, into a folder of its own put on ``sys.path``; the modules are ``tei_pb2`` and
``tei_pb2_grpc``, as protoc names them."""

from __future__ import annotations

import functools
import importlib
import sys
import tempfile
from pathlib import Path
from types import ModuleType

PROTO = Path(__file__).resolve().parent / "data" / "tei" / "tei.proto"


@functools.cache
def tei_stubs() -> tuple[ModuleType, ModuleType]:
    """(``tei_pb2``, ``tei_pb2_grpc``) generated from TEI's file."""
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="tei-stubs-")
    status = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}", f"--grpc_python_out={out}", PROTO.name])
    assert status == 0, f"protoc failed on {PROTO}"
    sys.path.insert(0, out)
    return importlib.import_module("tei_pb2"), importlib.import_module("tei_pb2_grpc")


def generated(proto: Path, out: Path) -> Path:
    """``proto``'s Python modules generated into ``out`` (as the shipped stubs are), and ``out``."""
    from grpc_tools import protoc

    args = [f"-I{proto.parent}", f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", proto.name]
    assert protoc.main(["protoc", *args]) == 0, f"protoc failed on {proto}"
    return out
