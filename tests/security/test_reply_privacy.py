"""The reply port under CURVE, attacked by a client whose key the server lists: a real server
on loopback, a victim client that makes 1,200 requests, and an attacker that meanwhile talks
to the reply port in every way it can and reads everything that comes back.

The sink's replies leave on a ``ROUTER``: a client connects a ``DEALER`` with a random routing
id and announces its client id, and the sink routes a reply only to connections that announced
a client id of the key the reply belongs to, as that announcement's own ``User-Id`` says. The
bug this guards against came with ``XPUB_MANUAL``, which pairs a subscription with the pipe
of the last subscription read: a flood of other messages shifted that pairing, and an attacker
read 9 of a victim's 40 replies. Here the attacker, who knows the victim's client id, uses

- a ``DEALER`` (a random 16-byte routing id, as a real client's) that floods empty messages,
  messages whose first byte is neither 0 nor 1, XSUB subscriptions (to the victim's id, to its
  own, to everything), unsubscriptions, garbage of 1 to 5 frames, frames past the port's size
  limit (the sink's socket then drops the connection, and the ``DEALER`` reconnects), and,
  between them, announcements in the client's own format of its own id, of the victim's id,
  of prefixes of it and of many ids of its own key;
- a second ``DEALER`` that announces only the victim's id and its prefixes;
- a ``ROUTER`` that names the sink's connection and announces both ids through it;
- a ``REQ`` (relaxed) that announces both ids;
- an ``XSUB`` that subscribes to everything and to the victim's id, with junk between, and a
  ``SUB`` subscribed to everything (neither may connect to a ``ROUTER``: their handshakes fail);
- its own ``BertClient``, encoding all along, so that replies of its own key flow.

It must read none of the victim's replies (nor any reply not of its own key), while the
``DEALER`` and the ``ROUTER`` that announce its own id do read its own replies (so the zero
means something); every one of the victim's requests must get the right vectors; and the
server must still run, with no traceback in its log.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import zmq
from bertserve.client import protocol as p
from bertserve.client.security import CURVE_KEY_LENGTH, ROUTE_ID_BYTES, announce, keygen, load_public_key
from bertserve.server.security import MAX_TOPIC_BYTES
from bertserve.server.serving.sink.replies import MAX_INBOUND_BYTES
from bertserve.server.testing.launcher import RunningServer, start_server
from faulty_model import expected, pythonpath_env, sentences
from integration.test_curve import Keys, client, curve_socket
from zmq.utils.monitor import recv_monitor_message

pytestmark = pytest.mark.timeout(120)

MODEL = "faulty_model:FaultyModel"
SEED = 20_250_612
VICTIM_REQUESTS = 1_200
HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
SETTLE_S = 1.0  # the attacker keeps reading this long after the victim's last reply


@dataclass
class Tally:
    """What one attacker socket sent and read."""

    sent: int = 0
    own: int = 0  # replies to a client id of the attacker's key
    victim: int = 0  # messages holding the victim's key (its client id starts with it)
    other: int = 0  # anything else that came back
    handshakes: int = 0  # CURVE handshakes that succeeded: its connections to the sink
    refused: int = 0  # handshakes that failed
    samples: list[list[bytes]] = field(default_factory=list)

    def read(self, frames: list[bytes], own_key: bytes, victim_key: bytes) -> None:
        if any(victim_key in frame for frame in frames):
            self.victim += 1
        elif any(frame.startswith(own_key + b":") for frame in frames[:2]):  # a ROUTER reads [peer, id, ...]
            self.own += 1
            return
        else:
            self.other += 1
        if len(self.samples) < 5:
            self.samples.append([frame[:80] for frame in frames])


def route_id(rng: random.Random) -> bytes:
    """A routing id as a real client's reply socket has: 16 random bytes, not starting with 0."""
    return bytes([rng.randrange(1, 256)]) + rng.randbytes(ROUTE_ID_BYTES - 1)


class Attack:
    """The attacker's sockets on the reply port, driven from one thread (zmq sockets are not
    thread-safe), and its own legitimate client in another."""

    def __init__(self, server: RunningServer, keys: Keys, victim_id: bytes, stop: threading.Event) -> None:
        self.server, self.keys, self.stop = server, keys, stop
        self.rng = random.Random(SEED)
        self.victim_id = victim_id
        # A client id is <key>:<suffix>, and a z85 key may hold a ':' of its own: the key is
        # the first CURVE_KEY_LENGTH bytes (cut at the first ':', it was a short prefix, which
        # a reply's binary vectors held by chance, counted as the victim's).
        self.victim_key = victim_id[:CURVE_KEY_LENGTH]
        self.key = load_public_key(str(keys.root / "clients" / "mallory.key"))
        self.own_id = b""  # the attacker's BertClient's id, once it is connected
        self.own_ready = threading.Event()
        self.tallies = {name: Tally() for name in ("flood", "thief", "router", "req", "xsub", "sub")}
        self.own_requests = 0
        self.own_errors: list[str] = []
        self.errors: list[str] = []

    # -- the attacker's own client -----------------------------------------------------

    def legit(self) -> None:
        rng = np.random.default_rng(SEED + 1)
        try:
            with client(self.server, self.keys, "mallory", timeout=10_000) as own:
                self.own_id = own.identity
                self.own_ready.set()
                while not self.stop.is_set():
                    texts = sentences(int(rng.integers(1, 4)), seed=int(rng.integers(1 << 30)))
                    try:
                        if not np.allclose(own.encode(texts), expected(texts), atol=1e-6):
                            self.own_errors.append(f"wrong vectors for {texts}")
                    except Exception as exc:  # its own trouble: reported, not fatal to the attack
                        self.own_errors.append(repr(exc))
                    self.own_requests += 1
        except BaseException as exc:
            self.errors.append(f"the attacker's client: {exc!r}")
        finally:
            self.own_ready.set()

    # -- what goes on the reply port -------------------------------------------------------

    def topics(self) -> list[bytes]:
        """Announced topics: the victim's id and its prefixes, and ids (good and bad) of our key."""
        victim, own, key = self.victim_id, self.own_id, self.key
        return [
            victim,
            victim[: len(self.victim_key) + 2],
            self.victim_key + b":",
            self.victim_key,
            victim + b"x",
            b"",
            b":",
            own,
            own[: len(key) + 2],
            key + b":",
            key,
            key + b":" + victim,
            own + b"x" * MAX_TOPIC_BYTES,
            key + b":" + self.rng.randbytes(8).hex().encode(),  # many ids of our own key: its route table churns
        ]

    def junk(self, *, oversize: bool) -> list[bytes]:
        """One message of the flood that is not an announcement in the client's format."""
        victim, own, rng = self.victim_id, self.own_id, self.rng
        if oversize:
            return [rng.choice([b"\x01" + victim, p.ANNOUNCE, b"x"]) + b"x" * (MAX_INBOUND_BYTES + 1)]
        choices: list[Callable[[], list[bytes]]] = [
            lambda: [b""],
            lambda: [bytes([rng.randrange(2, 256)]) + rng.randbytes(rng.randrange(0, 40))],
            lambda: [b"\x01" + victim],
            lambda: [b"\x01" + own],
            lambda: [b"\x01"],
            lambda: [b"\x01" + self.victim_key],
            lambda: [b"\x00" + victim],
            lambda: [b"\x00"],
            lambda: [rng.randbytes(rng.randrange(0, 70)) for _ in range(rng.randrange(1, 6))],
            lambda: [p.ANNOUNCE, victim, own],
            lambda: [p.ANNOUNCE, own, victim],
            lambda: [p.ANNOUNCE],
            lambda: [b"\x01" + victim, p.ANNOUNCE, own],
            lambda: [victim, p.ANNOUNCE, victim],
            lambda: [b"announce", victim],
            lambda: [p.ENCODE, victim],
        ]
        return rng.choice(choices)()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.errors.append(f"the attacker's sockets: {exc!r}")

    def _run(self) -> None:
        self.own_ready.wait(30)
        if not self.own_id:
            raise RuntimeError("the attacker's own client did not connect")
        address = f"tcp://127.0.0.1:{self.server.port_out}"
        context = zmq.Context()
        sockets: dict[str, zmq.Socket] = {}
        try:
            for name, kind in (
                ("flood", zmq.DEALER),
                ("thief", zmq.DEALER),
                ("router", zmq.ROUTER),
                ("req", zmq.REQ),
                ("xsub", zmq.XSUB),
                ("sub", zmq.SUB),
            ):
                sock = sockets[name] = curve_socket(context, kind, self.keys, "mallory")
                sock.reconnect_ivl = 20  # back soon after the sink drops it for an oversize frame
                sock.sndtimeo = 0
                if kind in (zmq.DEALER, zmq.ROUTER, zmq.REQ):
                    sock.setsockopt(zmq.ROUTING_ID, route_id(self.rng))
            sockets["router"].setsockopt(zmq.CONNECT_ROUTING_ID, b"sink")  # our name for the sink's connection
            sockets["req"].setsockopt(zmq.REQ_RELAXED, 1)
            sockets["sub"].setsockopt(zmq.SUBSCRIBE, b"")
            monitors = {sock.get_monitor_socket(HANDSHAKE_EVENTS): name for name, sock in sockets.items()}
            for sock in sockets.values():
                sock.connect(address)
            poller = zmq.Poller()
            for sock in [*sockets.values(), *monitors]:
                poller.register(sock, zmq.POLLIN)
            names = {sock: name for name, sock in sockets.items()}

            def send(name: str, frames: list[bytes]) -> None:
                try:
                    sockets[name].send_multipart(frames, zmq.NOBLOCK)
                except zmq.Again:  # not connected (the XSUB and the SUB never are), or a full queue
                    return
                self.tallies[name].sent += 1

            def announce_on(name: str, topic: bytes) -> None:  # as a real client does, counting what goes
                if sockets[name].poll(0, zmq.POLLOUT):
                    announce(sockets[name], topic)
                    self.tallies[name].sent += 1

            rounds = 0
            settle_until = float("inf")
            while time.monotonic() < settle_until:
                if self.stop.is_set() and settle_until == float("inf"):
                    settle_until = time.monotonic() + SETTLE_S
                if not self.stop.is_set():
                    rounds += 1
                    topics = self.topics()
                    for _ in range(20):
                        send("flood", self.junk(oversize=False))
                        if self.rng.random() < 0.3:
                            announce_on("flood", self.rng.choice(topics))
                    announce_on("flood", self.own_id)  # so our own replies reach it between the junk
                    announce_on("flood", self.victim_id)
                    if rounds % 100 == 0:
                        send("flood", self.junk(oversize=True))
                    announce_on("thief", self.rng.choice(topics[:5]))
                    send("router", [b"sink", p.ANNOUNCE, self.rng.choice([self.victim_id, self.own_id])])
                    send("req", [p.ANNOUNCE, self.rng.choice([self.victim_id, self.own_id])])
                    send("xsub", self.rng.choice([[b"\x01"], [b"\x01" + self.victim_id], self.junk(oversize=False)]))
                for sock, _ in poller.poll(1 if not self.stop.is_set() else 50):
                    if sock in monitors:
                        while sock.poll(0):
                            event = recv_monitor_message(sock)["event"]
                            tally = self.tallies[monitors[sock]]
                            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                                tally.handshakes += 1
                            else:
                                tally.refused += 1
                        continue
                    while True:
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self.tallies[names[sock]].read(frames, self.key, self.victim_key)
        finally:
            for sock in sockets.values():
                sock.disable_monitor()
            context.destroy(linger=0)


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    root = tmp_path / "curve"
    keygen(root, "server")
    for name in ("victim", "mallory"):
        keygen(root / "clients", name)
    return Keys(root)


def test_an_authenticated_attacker_reads_none_of_another_keys_replies(
    keys: Keys, tiny_google: str, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    server = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        MODEL,
        "--max-seq-len",
        "32",
        "--curve-dir",
        str(keys.root),
        "--max-latency-ms",
        "1",
        env=pythonpath_env(),
        log_path=log,
    )
    stop = threading.Event()
    failures: list[str] = []
    threads: list[threading.Thread] = []
    try:
        with client(server, keys, "victim", timeout=10_000) as victim:
            attack = Attack(server, keys, victim.identity, stop)
            threads = [
                threading.Thread(target=attack.legit, name="attacker-client", daemon=True),
                threading.Thread(target=attack.run, name="attacker-sockets", daemon=True),
            ]
            for thread in threads:
                thread.start()
            attack.own_ready.wait(30)
            time.sleep(0.5)  # the attack is under way before the victim starts
            rng = np.random.default_rng(SEED + 2)
            started = time.monotonic()
            victim_requests = 0
            for number in range(VICTIM_REQUESTS):
                victim_requests += 1
                texts = sentences(int(rng.integers(1, 4)), seed=int(rng.integers(1 << 30)))
                texts[0] = f"victim secret {number} {texts[0]}"
                try:
                    vectors = victim.encode(texts)
                except Exception as exc:
                    failures.append(f"request {number}: {exc!r}")
                    continue
                if not np.allclose(vectors, expected(texts), atol=1e-6):
                    failures.append(f"request {number}: wrong vectors for {texts}")
            victim_s = time.monotonic() - started
        stop.set()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive(), f"{thread.name} did not stop"
        assert server.process.poll() is None, "the server died under the attack"
    finally:
        stop.set()
        server.stop()
    text = log.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in text, text[text.index("Traceback") - 2000 :][:6000]
    tallies = attack.tallies
    connected = {
        name: tally for name, tally in tallies.items() if tally.handshakes
    }  # an XSUB drops what it cannot send
    sent = sum(tally.sent for tally in connected.values())
    victim_read = sum(tally.victim for tally in tallies.values())
    other_read = sum(tally.other for tally in tallies.values())
    own_read = sum(tally.own for tally in tallies.values())
    print(
        f"\nattacker sent {sent} messages on the reply port "
        f"({', '.join(f'{name} {tally.sent}' for name, tally in connected.items())}) and made {attack.own_requests} "
        f"requests of its own; the victim made {victim_requests} requests in {victim_s:.1f} s, {len(failures)} failed; "
        f"the attacker read {own_read} replies of its own "
        f"({', '.join(f'{name} {tally.own}' for name, tally in tallies.items() if tally.own)}), "
        f"{victim_read} of the victim's and {other_read} other messages; handshakes made/refused "
        f"{', '.join(f'{name} {tally.handshakes}/{tally.refused}' for name, tally in tallies.items())}"
    )
    assert not attack.errors, attack.errors
    assert victim_read == 0 and other_read == 0, {n: t.samples for n, t in tallies.items() if t.samples}
    assert not failures, failures[:10]
    assert victim_requests >= 1_000
    assert sent >= 10_000 and tallies["flood"].sent > 0 and tallies["thief"].sent > 0
    assert attack.own_requests > 0 and not attack.own_errors, attack.own_errors[:5]
    assert tallies["flood"].own > 0, "the flooding DEALER read no reply of its own: the zero above means nothing"
    assert tallies["flood"].handshakes > 1, "the sink never dropped the flooding DEALER for an oversize frame"
    assert text.count("\n") < 5_000, "the refusals flooded the log"
