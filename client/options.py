"""A client's options, checked once where they enter: host and ports, the timeout, the
identity its replies are addressed to, and the CURVE keys it loads.

``BertClient`` and ``ConcurrentBertClient`` both check here, so a bad option fails the
same way, before any socket is opened.
"""

from __future__ import annotations

import math
import os
import uuid
from dataclasses import dataclass, field

from .security import CURVE_KEY_LENGTH, KeySource, load_public_key, load_secret_cert

DEFAULT_HOST = "localhost"
DEFAULT_PORT = 5555
DEFAULT_TIMEOUT_MS = 60_000
MAX_IDENTITY_BYTES = 64


@dataclass(frozen=True)
class Curve:
    """The keys a CURVE client's sockets use: the server's public key and this client's pair."""

    server: bytes
    public: bytes
    secret: bytes = field(repr=False)


def check_timeout(timeout: object) -> float:
    """``timeout`` in milliseconds as a float; it must be finite and positive."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of milliseconds, not {type(timeout).__name__}")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(
            f"timeout must be a finite number of milliseconds > 0, not {timeout!r}: "
            "a bertserve client never waits forever"
        )
    return float(timeout)


def check_port(name: str, port: object) -> int:
    """``port`` (the option called ``name``) if it is an int from 1 to 65535."""
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"{name} must be an int, not {type(port).__name__}")
    if not 0 < port < 65536:
        raise ValueError(f"{name} must be 1 to 65535, not {port}")
    return port


def check_port_out(port: int, port_out: object) -> int:
    """The reply port: ``port_out``, or ``port + 1`` when it is ``None``."""
    if port_out is not None:
        return check_port("port_out", port_out)
    if port == 65535:
        raise ValueError("port_out defaults to port + 1, and port is 65535: pass port_out")
    return port + 1


def check_identity(identity: bytes | str | None, public_key: bytes | None = None) -> bytes:
    """The bytes replies are addressed to. Under CURVE that is ``public_key + b":" + suffix``
    (``identity`` is the suffix, by default 16 random hex digits): the server lets a client
    subscribe only to identities of its own key."""
    if identity is None:
        identity = uuid.uuid4().hex[: 16 if public_key else 32].encode("ascii")
    if isinstance(identity, str):
        identity = identity.encode("utf-8")
    if not isinstance(identity, bytes):
        raise TypeError(f"identity must be bytes or str, not {type(identity).__name__}")
    if not 0 < len(identity) <= MAX_IDENTITY_BYTES:
        # An empty identity would subscribe to every client's replies.
        raise ValueError(f"identity must be 1 to {MAX_IDENTITY_BYTES} bytes, not {len(identity)}")
    if public_key is None:
        return identity
    full = public_key + b":" + identity
    if len(full) > MAX_IDENTITY_BYTES:
        most = MAX_IDENTITY_BYTES - CURVE_KEY_LENGTH - 1
        raise ValueError(
            f"identity {identity!r} is {len(identity)} bytes: under CURVE the client id is the public key "
            f"(40 bytes), ':' and the identity, at most {MAX_IDENTITY_BYTES} bytes in all, so an identity "
            f"may have at most {most} bytes"
        )
    return full


def load_curve(server_key: KeySource | None, client_cert: str | os.PathLike[str] | None) -> Curve | None:
    """The CURVE keys from ``server_key`` and ``client_cert``, or ``None`` if neither is given."""
    if server_key is None and client_cert is None:
        return None
    if server_key is None or client_cert is None:
        given, missing = ("server_key", "client_cert") if client_cert is None else ("client_cert", "server_key")
        raise ValueError(
            f"CURVE needs both server_key (the server's public key) and client_cert (this client's "
            f"NAME.key_secret): {given} was given without {missing}"
        )
    public, secret = load_secret_cert(client_cert)
    return Curve(server=load_public_key(server_key), public=public, secret=secret)
