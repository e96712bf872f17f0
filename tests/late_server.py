"""A stand-in for a bertserve server that answers the handshake late or at once, for the
tests of a client that finds no server (tests/unit/client/test_no_server.py) and of ``bertserve
encode`` without one (tests/integration/test_encode_without_a_server.py)."""

from __future__ import annotations

import threading
import time

import numpy as np
import zmq
from bertserve.client import __version__, protocol as p


class LateServer:
    """Answers CONFIG after ``delay_s`` (as a server whose PUB has not yet seen the client's
    subscription), then ENCODE at once with one row ``[words, 0, 0, 0]`` per text."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self._context = zmq.Context()
        self._pull = self._context.socket(zmq.PULL)
        self._pub = self._context.socket(zmq.PUB)
        for sock in (self._pull, self._pub):
            sock.setsockopt(zmq.LINGER, 0)
        self.port = self._pull.bind_to_random_port("tcp://127.0.0.1")
        self.port_out = self._pub.bind_to_random_port("tcp://127.0.0.1")
        self._first_seen: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._pull.poll(10):
                    continue
                request = p.decode_request(self._pull.recv_multipart())
                cid, rid = request.client_id, request.request_id
                if request.command == p.CONFIG:
                    self._first_seen = self._first_seen or time.monotonic()
                    if time.monotonic() - self._first_seen >= self.delay_s:
                        config = {"server_version": __version__, "protocol": p.PROTOCOL_VERSION, "output_dim": 4}
                        self._pub.send_multipart(p.encode_reply(cid, rid, True, config))
                elif request.command == p.ENCODE:
                    words = [len(text if isinstance(text, list) else text.split()) for text in request.texts]
                    vectors = np.array([[n, 0, 0, 0] for n in words], np.float32).reshape(-1, 4)
                    self._pub.send_multipart(p.encode_reply(cid, rid, True, p.array_header(vectors), vectors.tobytes()))
        finally:
            self._pull.close()
            self._pub.close()
            self._context.term()
