"""The shipped stubs (``bertserve.client.tei``) are TEI's protocol unchanged: their descriptor is
the one protoc makes of TEI's published ``tei.proto``, and they are what protoc makes of the
shipped copy today (the one edit: the services module imports its messages relatively)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from bertserve.client.tei import tei_pb2, tei_pb2_grpc
from google.protobuf import descriptor_pb2
from tei_stubs import PROTO, generated

SHIPPED = Path(tei_pb2.__file__).parent


def _descriptor(module_text: str) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto a generated ``_pb2`` module adds to the pool."""
    start = module_text.index("AddSerializedFile(") + len("AddSerializedFile(")
    serialized = ast.literal_eval(module_text[start : module_text.index(")\n", start)])  # a bytes literal
    return descriptor_pb2.FileDescriptorProto.FromString(serialized)


def test_the_shipped_descriptor_is_teis_own(tmp_path: Path) -> None:
    theirs = _descriptor((generated(PROTO, tmp_path) / "tei_pb2.py").read_text())
    ours = descriptor_pb2.FileDescriptorProto()
    tei_pb2.DESCRIPTOR.CopyToProto(ours)
    assert ours == theirs
    assert ours.package == "tei.v1"
    assert [s.name for s in ours.service] == ["Info", "Embed", "Predict", "Rerank", "Tokenize"]


def test_the_shipped_modules_are_what_protoc_makes_of_the_shipped_proto(tmp_path: Path) -> None:
    out = generated(SHIPPED / "tei.proto", tmp_path)
    assert (out / "tei_pb2.py").read_text() == (SHIPPED / "tei_pb2.py").read_text()
    assert (out / "tei_pb2.pyi").read_text() == (SHIPPED / "tei_pb2.pyi").read_text()
    made = (out / "tei_pb2_grpc.py").read_text().replace("import tei_pb2 as", "from . import tei_pb2 as")
    assert made == (SHIPPED / "tei_pb2_grpc.py").read_text()


def test_every_method_of_the_protocol_has_a_stub() -> None:
    methods = {
        service.name: [method.name for method in service.methods]
        for service in tei_pb2.DESCRIPTOR.services_by_name.values()
    }
    assert methods["Embed"] == [
        "Embed",
        "EmbedStream",
        "EmbedSparse",
        "EmbedSparseStream",
        "EmbedAll",
        "EmbedAllStream",
    ]
    for service, names in methods.items():
        stub = getattr(tei_pb2_grpc, f"{service}Stub")
        channel = pytest.importorskip("grpc").insecure_channel("127.0.0.1:9")  # never dialled: stubs only
        made = stub(channel)
        assert all(callable(getattr(made, name)) for name in names)
        channel.close()
