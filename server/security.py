"""Who may talk to the server: CURVE keys, the authenticator, and the rules on identities.

Trust model. Without CURVE the server trusts every process that can reach its ports, so it
binds to loopback by default (:func:`loopback_only`): any local process may encode, read
the replies of any client whose id it knows, and stop the server. With CURVE (a key
directory, :func:`load_curve_dir`) only clients whose public key is listed in ``clients/``
can connect, and all traffic is encrypted. A client authenticated with key ``K`` must use
client ids ``K:suffix`` (:func:`identity_belongs`), so it can neither send requests as
another key (:func:`request_allowed`, checked against each request's own ``User-Id``) nor
route another key's replies to itself (:func:`route_allowed`, checked against each
announcement's own ``User-Id`` by the sink's reply ``ROUTER``, see
``bertserve.server.serving.sink.replies``). TERMINATE is honoured only from keys listed in
``admins/`` (:func:`is_admin`).

Key files are checked when read (:func:`load_curve_dir`, :func:`unsafe_mode`): a start is
refused when the key directory, ``clients/``, ``admins/`` or ``workers/`` or a key file in them
may be written by group or others (one could add an admin key, or swap the server's), or when
the server's secret may be read by them, naming the path and the ``chmod`` that fixes it.

The key-file helpers live in ``bertserve.client.security`` (the client needs them without
the server) and are re-exported here.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
from bertserve.client.security import CURVE_KEY_LENGTH, is_z85_key, keygen, load_public_key, load_secret_cert
from zmq.auth.thread import ThreadAuthenticator

__all__ = [
    "CURVE_KEY_LENGTH",
    "MAX_TOPIC_BYTES",
    "WORKER_DOMAIN",
    "CurveServerKeys",
    "handle_subscription",
    "identity_belongs",
    "is_admin",
    "is_z85_key",
    "keygen",
    "load_curve_dir",
    "load_public_key",
    "load_secret_cert",
    "loopback_only",
    "make_curve_server",
    "message_user_id",
    "request_allowed",
    "route_allowed",
    "start_authenticator",
    "subscription_allowed",
    "unsafe_mode",
]

logger = logging.getLogger("bertserve.security")

MAX_TOPIC_BYTES = 64
"""The longest client id, and so the longest subscription topic, the server accepts."""

WORKER_DOMAIN = "workers"
"""The ZAP domain of the worker link: only keys in ``workers/`` may connect to it."""

UserId = bytes | str | None
"""A message's ``User-Id`` property: the client's z85 public key under CURVE, else absent."""


@dataclass(frozen=True)
class CurveServerKeys:
    """The server's CURVE key pair and who may connect, as :func:`load_curve_dir` reads them.

    ``clients_dir`` holds the public certificates (``*.key``) of every client allowed to
    connect; ``admins`` are the z85 public keys allowed to send TERMINATE (each also in
    ``clients_dir``); ``workers`` those of remote workers allowed to join (``workers/``).
    """

    public: bytes
    secret: bytes
    clients_dir: Path
    admins: frozenset[bytes] = frozenset()
    workers: frozenset[bytes] = frozenset()  # remote workers allowed on the worker link (workers/*.key)

    def __repr__(self) -> str:  # never print the secret key
        return (
            f"CurveServerKeys(public={self.public!r}, clients_dir={self.clients_dir!r}, admins={len(self.admins)}, "
            f"workers={len(self.workers)})"
        )


def load_curve_dir(curve_dir: str | os.PathLike[str]) -> CurveServerKeys:
    """Read a server key directory: ``server.key_secret``, ``clients/*.key`` (at least one)
    and optionally ``admins/*.key`` and ``workers/*.key``. Raises ``ValueError`` naming what
    is missing or wrong, or a directory or file others may change (:func:`check_key_modes`)."""
    root = Path(curve_dir)
    make = f"make one with `bertserve keygen {root} --name server`"
    if not root.is_dir():
        raise ValueError(f"CURVE directory {root} does not exist: {make}")
    secret_file = root / "server.key_secret"
    if not secret_file.is_file():
        raise ValueError(f"CURVE directory {root} has no server.key_secret: {make}")
    check_key_modes(root)
    public, secret = load_secret_cert(secret_file)
    clients_dir = root / "clients"
    add_client = f"copy each allowed client's NAME.key (from `bertserve keygen DIR --name NAME`) into {clients_dir}"
    if not clients_dir.is_dir():
        raise ValueError(f"CURVE directory {root} has no clients/ directory: {add_client}")
    clients = {load_public_key(path) for path in sorted(clients_dir.glob("*.key"))}
    if not clients:
        raise ValueError(f"{clients_dir} holds no client public key (*.key): {add_client}")
    admins_dir = root / "admins"
    admins = frozenset(load_public_key(path) for path in sorted(admins_dir.glob("*.key")))
    if strangers := sorted(admins - clients):
        raise ValueError(
            f"{admins_dir} lists key(s) {', '.join(k.decode() for k in strangers)} that are not in "
            f"{clients_dir}: an admin must be allowed to connect too"
        )
    workers = frozenset(load_public_key(path) for path in sorted((root / "workers").glob("*.key")))
    return CurveServerKeys(public=public, secret=secret, clients_dir=clients_dir, admins=admins, workers=workers)


KEY_DIRECTORIES = ("clients", "admins", "workers")
"""The folders of a key directory whose keys say who may connect, stop the server, or join it."""


def check_key_modes(root: Path) -> None:
    """Raise ``ValueError`` naming the first of ``root``, its :data:`KEY_DIRECTORIES`, their
    ``*.key`` files and ``server.key``/``server.key_secret`` whose mode lets group or others
    change it, or read it for a secret; the message says the ``chmod`` that fixes it."""
    folders = [root, *(root / name for name in KEY_DIRECTORIES if (root / name).is_dir())]
    files = [path for folder in folders for path in sorted(folder.glob("*.key")) if path.is_file()]
    secrets = sorted(root.glob("*.key_secret"))
    for path in (*folders, *files, *secrets):
        problem = unsafe_mode(path, secret=path.suffix == ".key_secret")
        if problem is not None:
            raise ValueError(problem)


def unsafe_mode(path: str | os.PathLike[str], *, secret: bool = False) -> str | None:
    """What is unsafe about ``path``'s mode, with the ``chmod`` that fixes it; ``None`` if
    nothing is. Unsafe: writable by group or others (a directory or any key file), or, for a
    ``secret``, readable by them too. Symbolic links are followed (the target is what is read)."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    is_dir = os.path.isdir(path)
    if secret and mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"{path} is a secret key that group or other users may read or change (mode {mode:o}): chmod 600 {path}"
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        fix = "700" if is_dir else "644"
        what = "a key directory" if is_dir else "a key file"
        return (
            f"{path} is {what} that group or other users may change (mode {mode:o}), so they could add or swap "
            f"keys: chmod {fix} {path}"
        )
    return None


def start_authenticator(
    context: zmq.Context, keys: CurveServerKeys, extra_keys: frozenset[bytes] = frozenset()
) -> ThreadAuthenticator:
    """Start pyzmq's ZAP authenticator in ``context``, allowing the keys in ``keys.clients_dir``
    and the z85 public keys ``extra_keys`` (the HTTP front end's, which the server makes);
    on sockets of the ZAP domain :data:`WORKER_DOMAIN` (the worker link), only ``keys.workers``.

    It answers for the CURVE sockets of that context only, so each process that binds one
    (the ventilator's and the sink's) starts its own, before binding; ``stop()`` it at
    shutdown, before terminating the context. The client list is read once, now.
    """
    from zmq.auth.certs import load_certificates

    allowed = frozenset(load_certificates(os.fspath(keys.clients_dir))) | extra_keys
    authenticator = ThreadAuthenticator(context, log=logging.getLogger("bertserve.security.zap"))
    authenticator.start()
    try:
        provider = _AllowedKeys({WORKER_DOMAIN: keys.workers}, default=allowed)
        for domain in ("*", WORKER_DOMAIN):  # pyzmq looks a provider up by the socket's exact domain
            authenticator.configure_curve_callback(domain=domain, credentials_provider=provider)
    except BaseException:
        authenticator.stop()
        raise
    return authenticator


class _AllowedKeys:
    """pyzmq's credentials provider: a fixed set of z85 public keys for each ZAP domain."""

    def __init__(self, by_domain: dict[str, frozenset[bytes]], default: frozenset[bytes]) -> None:
        self._by_domain = by_domain
        self._default = default

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self._by_domain.get(domain, self._default)


def make_curve_server(socket: zmq.Socket, keys: CurveServerKeys) -> None:
    """Make ``socket`` a CURVE server with the server's key pair; call it before ``bind``."""
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_server = True


def message_user_id(frame: zmq.Frame) -> str | None:
    """The ``User-Id`` property of a frame received with ``copy=False``: the sender's z85
    public key under CURVE, ``None`` when the connection has none."""
    try:
        user_id = frame.get("User-Id")
    except zmq.ZMQError:  # no such property on this connection
        return None
    return user_id if isinstance(user_id, str) and user_id else None


def identity_belongs(user_id: UserId, client_id: bytes) -> bool:
    """Whether ``client_id`` is ``user_id + b":" + suffix`` with a non-empty suffix, the
    only client ids a client authenticated as ``user_id`` may use."""
    if user_id is None:
        return False
    key = user_id.encode("ascii", "replace") if isinstance(user_id, str) else user_id
    if not key:
        return False
    prefix = key + b":"
    return len(client_id) > len(prefix) and client_id.startswith(prefix)


def request_allowed(user_id: UserId, client_id: bytes, curve: bool) -> bool:
    """Whether a request sent under ``client_id`` is accepted: under CURVE only from the
    key the id belongs to; without CURVE from anyone (the protocol checks the id's length)."""
    return identity_belongs(user_id, client_id) if curve else True


def subscription_allowed(topic: bytes) -> bool:
    """Whether a subscriber (on the server without CURVE) may receive messages whose topic
    starts with ``topic``: any topic of 1 to 64 bytes. ZeroMQ matches topics by prefix, so
    the empty topic would read every client's replies and is always refused."""
    return 0 < len(topic) <= MAX_TOPIC_BYTES


def route_allowed(user_id: UserId, topic: bytes) -> bool:
    """Whether a connection authenticated as ``user_id`` may announce ``topic`` on a CURVE
    server's reply port, and so receive replies to client ids that start with it: only a
    client id of its own key (:func:`identity_belongs`), at most 64 bytes."""
    return len(topic) <= MAX_TOPIC_BYTES and identity_belongs(user_id, topic)


def handle_subscription(xpub: zmq.Socket, frame: zmq.Frame) -> bool:
    """Apply one (un)subscription message read from an ``XPUB_MANUAL`` socket, if allowed.

    For the server without CURVE only, which authenticates nobody: libzmq applies the option
    to the pipe of the last *subscription* message read, and other messages shift that
    pairing, so no per-subscriber check may rest on it (CURVE replies are routed instead).
    ``frame`` is the message just received from ``xpub``; its first byte is 1 to subscribe,
    0 to unsubscribe, the rest is the topic. Returns whether a subscription was applied; a
    refused one is logged and dropped. Unsubscribing is always applied: it can only narrow
    what a subscriber reads.
    """
    message = frame.bytes
    if not message or message[0] not in (0, 1):
        logger.warning("ignoring a malformed subscription message of %d bytes", len(message))
        return False
    topic = message[1:]
    if message[0] == 0:
        xpub.setsockopt(zmq.UNSUBSCRIBE, topic)
        return False
    if not subscription_allowed(topic):
        logger.warning("refused a subscription to %r", topic[:MAX_TOPIC_BYTES])
        return False
    xpub.setsockopt(zmq.SUBSCRIBE, topic)
    return True


def is_admin(user_id: UserId, keys: CurveServerKeys) -> bool:
    """Whether ``user_id`` (a message's ``User-Id``) is one of the keys in ``admins/``."""
    if user_id is None:
        return False
    key = user_id.encode("ascii", "replace") if isinstance(user_id, str) else user_id
    return key in keys.admins


def loopback_only(bind: str) -> bool:
    """Whether binding to ``bind`` (a host: ``127.0.0.1``, ``::1``, ``localhost``, ``*``,
    ``0.0.0.0``, ...) listens on the loopback interface only."""
    host = bind.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name or "*": it may resolve to, or mean, any interface
        return False
