"""The gRPC front end: Text Embeddings Inference's ``tei.v1`` protocol, gRPC's health and
reflection services, in a process of its own (``bertserve start --grpc-port``), which reaches
the head as the HTTP process does and shares its checks (:mod:`..http`)."""
