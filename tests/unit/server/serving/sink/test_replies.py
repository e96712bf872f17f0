"""``server/serving/sink/replies.py``'s ``Routed``: the CURVE reply port, with real ``DEALER`` clients
on loopback. A z85 key may hold a ``:`` (about one key in three does, and one in 85 starts
with one), so a client id is split at the key's fixed length, never at its first colon."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
from bertserve.client.security import announce, reply_socket
from bertserve.server import security as s
from bertserve.server.serving.sink.replies import Routed
from bertserve.server.testing.config import server_config
from zmq.auth.certs import _write_key_file

pytestmark = pytest.mark.timeout(30)


def keypair(wanted: str) -> tuple[bytes, bytes]:
    """A CURVE key pair whose public key starts with ``:`` (``wanted="first"``), or holds one
    only after its first character (``"inside"``)."""
    while True:
        public, secret = zmq.curve_keypair()
        if (wanted == "first") == public.startswith(b":") and (wanted == "first" or b":" in public[1:]):
            return public, secret


@dataclass
class Rig:
    replies: Routed
    keys: s.CurveServerKeys
    endpoint: str
    context: zmq.Context
    pairs: dict[str, tuple[bytes, bytes]]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A ``Routed`` reply port on loopback whose clients' keys hold a ``:``."""
    server_public, server_secret = zmq.curve_keypair()
    clients = tmp_path / "clients"
    clients.mkdir()
    pairs = {name: keypair(name) for name in ("first", "inside")}
    for name, (public, _) in pairs.items():
        _write_key_file(str(clients / f"{name}.key"), "test", public)
    keys = s.CurveServerKeys(server_public, server_secret, clients)
    context = zmq.Context()
    authenticator = s.start_authenticator(context, keys)
    config = server_config("unused")
    replies = Routed(context, config, keys)
    replies.socket.bind("tcp://127.0.0.1:0")
    endpoint = replies.socket.getsockopt(zmq.LAST_ENDPOINT).decode()
    try:
        yield Rig(replies, keys, endpoint, context, pairs)
    finally:
        replies.close()
        authenticator.stop()
        context.destroy(linger=0)


def client(context: zmq.Context, keys: s.CurveServerKeys, pair: tuple[bytes, bytes], topic: bytes) -> zmq.Socket:
    sock = reply_socket(context, topic, routed=True)
    sock.curve_serverkey = keys.public
    sock.curve_publickey, sock.curve_secretkey = pair
    return sock


def test_keys_holding_a_colon_get_their_own_replies_and_only_those(rig: Rig) -> None:
    replies, keys, endpoint, context, pairs = rig.replies, rig.keys, rig.endpoint, rig.context, rig.pairs
    ids = {name: pair[0] + b":c1" for name, pair in pairs.items()}
    sockets = {name: client(context, keys, pairs[name], ids[name]) for name in pairs}
    for name, sock in sockets.items():
        sock.connect(endpoint)
        announce(sock, ids[name])
    for _ in range(100):
        if all(replies.routes_to(client_id) for client_id in ids.values()):
            break
        replies.socket.poll(50)
        replies.read()
    for name, client_id in ids.items():
        assert replies.routes_to(client_id), f"the key {pairs[name][0]!r} has no route"
        replies.send([client_id, b"for " + name.encode()])
    for name, sock in sockets.items():
        assert sock.poll(5000), f"{name} got no reply"
        assert sock.recv_multipart() == [ids[name], b"for " + name.encode()]
        assert not sock.poll(200), f"{name} got another key's reply"
    assert replies.routes_to(pairs["first"][0][:5] + b":c1") == []
    for sock in sockets.values():
        sock.close(linger=0)
