"""``server/security.py``: key files, the identity rules, and the real ZeroMQ mechanism the
server relies on (CURVE + ZAP ``User-Id`` on each message), shown with raw pyzmq sockets on
loopback. The reply routing built on it is tested in ``test_replies.py``."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from bertserve.server import security as s

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def curve_dir(tmp_path: Path) -> Path:
    """A server key directory: server pair, clients alice and bob, admin alice; mallory's
    pair lies outside it."""
    root = tmp_path / "curve"
    s.keygen(root, "server")
    for name in ("alice", "bob"):
        s.keygen(tmp_path / "own", name)
        (root / "clients").mkdir(exist_ok=True)
        (root / "clients" / f"{name}.key").write_bytes((tmp_path / "own" / f"{name}.key").read_bytes())
    (root / "admins").mkdir()
    (root / "admins" / "alice.key").write_bytes((root / "clients" / "alice.key").read_bytes())
    s.keygen(tmp_path / "own", "mallory")
    return root


def cert(curve_dir: Path, name: str) -> tuple[bytes, bytes]:
    return s.load_secret_cert(curve_dir.parent / "own" / f"{name}.key_secret")


# -- key files ---------------------------------------------------------------------------


def test_keygen_writes_a_loadable_pair_and_never_overwrites(tmp_path: Path) -> None:
    public, secret = s.keygen(tmp_path / "new" / "dir", "me")
    assert (public.name, secret.name) == ("me.key", "me.key_secret")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    key, secret_key = s.load_secret_cert(secret)
    assert s.load_public_key(public) == s.load_public_key(secret) == key
    assert s.is_z85_key(key) and s.is_z85_key(secret_key) and key != secret_key
    assert sorted(p.name for p in public.parent.iterdir()) == ["me.key", "me.key_secret"]  # no staging left
    before = secret.read_bytes()
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        s.keygen(public.parent, "me")
    assert secret.read_bytes() == before
    public.unlink()
    with pytest.raises(FileExistsError, match=r"me\.key_secret already exists"):
        s.keygen(public.parent, "me")
    for bad in ("", ".hidden", "a/b"):
        with pytest.raises(ValueError, match="plain file name"):
            s.keygen(tmp_path, bad)


def test_loading_keys(tmp_path: Path) -> None:
    public, _ = s.keygen(tmp_path, "me")
    key = s.load_public_key(public)
    assert s.load_public_key(key) == s.load_public_key(key.decode()) == key
    with pytest.raises(ValueError, match="holds no secret key"):
        s.load_secret_cert(public)
    with pytest.raises(ValueError, match="no certificate file"):
        s.load_secret_cert(tmp_path / "missing.key_secret")
    for bad in ("short", str(tmp_path / "missing.key"), b"x" * 39, "~" * 40):
        with pytest.raises(ValueError, match="neither a certificate file"):
            s.load_public_key(bad)
    junk = tmp_path / "junk.key"
    junk.write_text('curve\n    public-key = "not-a-key"\n')
    with pytest.raises(ValueError, match="not a ZeroMQ CURVE certificate"):
        s.load_public_key(junk)


def test_load_curve_dir(curve_dir: Path) -> None:
    keys = s.load_curve_dir(curve_dir)
    assert keys.public == s.load_public_key(curve_dir / "server.key")
    assert keys.clients_dir == curve_dir / "clients"
    assert keys.admins == {cert(curve_dir, "alice")[0]}
    assert keys.secret.decode() not in repr(keys)
    alice, bob = cert(curve_dir, "alice")[0], cert(curve_dir, "bob")[0]
    assert s.is_admin(alice, keys) and s.is_admin(alice.decode(), keys)
    assert not s.is_admin(bob, keys) and not s.is_admin(None, keys)


def test_load_curve_dir_names_what_is_missing(curve_dir: Path) -> None:
    (curve_dir / "admins" / "mallory.key").write_bytes((curve_dir.parent / "own" / "mallory.key").read_bytes())
    with pytest.raises(ValueError, match=r"admins lists key\(s\) .* not in"):
        s.load_curve_dir(curve_dir)
    (curve_dir / "admins" / "mallory.key").unlink()
    for path in (curve_dir / "clients").iterdir():
        path.unlink()
    with pytest.raises(ValueError, match=r"clients holds no client public key \(\*\.key\)"):
        s.load_curve_dir(curve_dir)
    (curve_dir / "clients").rmdir()
    with pytest.raises(ValueError, match="has no clients/ directory"):
        s.load_curve_dir(curve_dir)
    (curve_dir / "server.key_secret").unlink()
    with pytest.raises(ValueError, match=r"has no server\.key_secret: make one with `bertserve keygen"):
        s.load_curve_dir(curve_dir)
    with pytest.raises(ValueError, match="does not exist"):
        s.load_curve_dir(curve_dir / "nowhere")


def test_keygen_makes_directories_and_files_others_cannot_change(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        public, secret = s.keygen(tmp_path / "a" / "b", "me")
        s.keygen(tmp_path / "a" / "b", "you")  # into a directory that is there
    finally:
        os.umask(old)
    modes = {path: stat.S_IMODE(path.stat().st_mode) for path in (tmp_path / "a", public.parent, public, secret)}
    assert list(modes.values()) == [0o700, 0o700, 0o644, 0o600]


@pytest.mark.parametrize(
    ("relative", "bits", "fix"),
    [
        (".", stat.S_IWGRP, "chmod 700"),
        ("clients", stat.S_IWOTH, "chmod 700"),
        ("admins", stat.S_IWGRP, "chmod 700"),
        ("admins/alice.key", stat.S_IWOTH, "chmod 644"),
        ("server.key", stat.S_IWGRP, "chmod 644"),
        ("server.key_secret", stat.S_IRGRP, "chmod 600"),
        ("server.key_secret", stat.S_IROTH, "chmod 600"),
    ],
)
def test_load_curve_dir_refuses_what_others_could_change_or_read(
    curve_dir: Path, relative: str, bits: int, fix: str
) -> None:
    path = curve_dir / relative
    path.chmod(stat.S_IMODE(path.stat().st_mode) | bits)
    with pytest.raises(ValueError) as refused:
        s.load_curve_dir(curve_dir)
    assert str(path) in str(refused.value) and f"{fix} {path}" in str(refused.value)
    path.chmod(stat.S_IMODE(path.stat().st_mode) & ~bits)
    s.load_curve_dir(curve_dir)


def test_readable_public_keys_are_safe(curve_dir: Path) -> None:
    assert s.unsafe_mode(curve_dir / "server.key") is None  # 0644: anyone may read a public key
    (curve_dir / "workers").mkdir(mode=0o755)
    assert s.unsafe_mode(curve_dir / "workers") is None
    (curve_dir / "workers").chmod(0o775)
    assert "chmod 700" in (s.unsafe_mode(curve_dir / "workers") or "")


# -- the identity rules ------------------------------------------------------------------

K = b"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"  # a z85 key may itself contain ":"
OTHER = b"Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"


@pytest.mark.parametrize(
    ("user_id", "client_id", "expected"),
    [
        (K, K + b":a", True),
        (K.decode(), K + b":client-1", True),
        (K, K, False),  # no separator
        (K, K + b":", False),  # empty suffix
        (K, OTHER + b":a", False),  # another key's id
        (K, b"", False),
        (None, K + b":a", False),  # not authenticated
        ("", b":a", False),
        (K[:-1], K + b":a", False),  # a key that is a prefix of the id's key
    ],
)
def test_identity_belongs(user_id: Any, client_id: bytes, expected: bool) -> None:
    assert s.identity_belongs(user_id, client_id) is expected
    assert s.request_allowed(user_id, client_id, curve=True) is expected
    assert s.request_allowed(user_id, client_id, curve=False)


@pytest.mark.parametrize(
    ("user_id", "topic", "expected"),
    [
        (K, K + b":a", True),
        (K.decode(), K + b":a", True),
        (K, b"", False),  # ZeroMQ's prefix match: the empty topic reads every reply
        (K, K, False),  # the key alone would read every client id of that key, not ids
        (K, K[:10], False),
        (K, K + b":", False),
        (K, OTHER + b":a", False),
        (None, K + b":a", False),
        (K, K + b":" + b"x" * 23, True),  # 64 bytes
        (K, K + b":" + b"x" * 24, False),  # 65 bytes
    ],
)
def test_route_allowed(user_id: Any, topic: bytes, expected: bool) -> None:
    assert s.route_allowed(user_id, topic) is expected


@pytest.mark.parametrize(
    ("topic", "expected"), [(b"", False), (b"anything", True), (b"x" * 64, True), (b"x" * 65, False)]
)
def test_subscription_allowed(topic: bytes, expected: bool) -> None:
    # Without CURVE: the empty topic (every reply) and over-long topics are refused.
    assert s.subscription_allowed(topic) is expected


@pytest.mark.parametrize(
    ("bind", "expected"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("*", False),
        ("::", False),
        ("10.0.0.1", False),
        ("example.com", False),
    ],
)
def test_loopback_only(bind: str, expected: bool) -> None:
    assert s.loopback_only(bind) is expected


class FakeFrame:
    def __init__(self, message: bytes) -> None:
        self.bytes = message


class FakeXPub:
    def __init__(self) -> None:
        self.calls: list[tuple[int, bytes]] = []

    def setsockopt(self, option: int, value: bytes) -> None:
        self.calls.append((option, value))


def test_handle_subscription_applies_only_what_is_allowed() -> None:
    xpub = FakeXPub()
    assert s.handle_subscription(xpub, FakeFrame(b"\x01plain"))  # type: ignore[arg-type]
    for message in (b"\x01", b"", b"\x02plain", b"\x01" + b"x" * 65):
        assert not s.handle_subscription(xpub, FakeFrame(message))  # type: ignore[arg-type]
    assert not s.handle_subscription(xpub, FakeFrame(b"\x00plain"))  # type: ignore[arg-type]
    assert xpub.calls == [(zmq.SUBSCRIBE, b"plain"), (zmq.UNSUBSCRIBE, b"plain")]


# -- the real mechanism, with pyzmq on loopback ------------------------------------------


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.destroy(linger=0)


def curve_client(ctx: zmq.Context, kind: int, keys: s.CurveServerKeys, own: tuple[bytes, bytes]) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey = keys.public
    sock.curve_publickey, sock.curve_secretkey = own
    return sock


def test_curve_pull_reads_the_senders_key_and_refuses_strangers(context: zmq.Context, curve_dir: Path) -> None:
    keys = s.load_curve_dir(curve_dir)
    authenticator = s.start_authenticator(context, keys)
    try:
        pull = context.socket(zmq.PULL)
        pull.setsockopt(zmq.LINGER, 0)
        s.make_curve_server(pull, keys)
        pull.bind("tcp://127.0.0.1:0")
        endpoint = pull.getsockopt(zmq.LAST_ENDPOINT).decode()
        alice, bob, mallory = (cert(curve_dir, name) for name in ("alice", "bob", "mallory"))
        senders = {}
        for name, own in (("mallory", mallory), ("alice", alice), ("bob", bob)):
            senders[name] = push = curve_client(context, zmq.PUSH, keys, own)
            push.connect(endpoint)
        senders["mallory"].send_multipart([mallory[0] + b":m", b"hello"])
        senders["alice"].send_multipart([alice[0] + b":a", b"hello"])
        senders["bob"].send_multipart([alice[0] + b":a", b"hello"])  # bob pretends to be alice

        seen: dict[str, bool] = {}
        while len(seen) < 2 and pull.poll(5000):
            frames = pull.recv_multipart(copy=False)
            user_id = s.message_user_id(frames[0])
            assert user_id is not None
            seen[user_id] = s.request_allowed(user_id, frames[0].bytes, curve=True)
        assert seen == {alice[0].decode(): True, bob[0].decode(): False}
        assert not pull.poll(200)  # mallory's key is not listed: nothing of hers arrives
    finally:
        authenticator.stop()


def test_without_curve_there_is_no_user_id(context: zmq.Context) -> None:
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    for sock in (pull, push):
        sock.setsockopt(zmq.LINGER, 0)
    pull.bind("tcp://127.0.0.1:0")
    push.connect(pull.getsockopt(zmq.LAST_ENDPOINT).decode())
    push.send(b"x")
    assert pull.poll(5000)
    assert s.message_user_id(pull.recv(copy=False)) is None
