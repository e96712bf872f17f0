"""Text Embeddings Inference's gRPC protocol, ``tei.v1``, as Python code generated from its
``tei.proto`` (shipped here unchanged, :data:`PROTO`): ``tei_pb2`` holds the messages,
``tei_pb2_grpc`` the stubs a client calls a ``bertserve start --grpc-port`` server with (and
any TEI server). They need ``grpcio`` and ``protobuf``: ``pip install 'bertserve[grpc]'``.

    import grpc
    from bertserve.client.tei import tei_pb2, tei_pb2_grpc

    with grpc.insecure_channel("localhost:50051") as channel:
        answer = tei_pb2_grpc.EmbedStub(channel).Embed(tei_pb2.EmbedRequest(inputs="hello world"))
        vector = list(answer.embeddings)

docs/grpc.md says how to generate a client in another language from :data:`PROTO`.
"""

from pathlib import Path

PROTO = Path(__file__).with_name("tei.proto")
"""The protocol's ``.proto`` file."""
