"""The client's side of CURVE: key files, and telling a refused handshake from a dead server
and from a port that is not the server's.

Certificates are pyzmq's (``zmq.auth.create_certificates``): ``NAME.key`` holds the public
key and may be handed out; ``NAME.key_secret`` holds both keys and stays with its owner
(mode 0600). Keys are z85 text, 40 ASCII characters. The key helpers live in the client
package because the client needs them without the server; ``bertserve.server.security``
re-exports them.

Under CURVE a client reads its replies from a ``DEALER`` that announces its client id
(:func:`reply_socket`, :func:`announce`), never from a ``SUB``: the server routes each reply
by the key that announced it, not by a subscription.

A ZeroMQ socket whose handshake fails just retries in silence, so a refused client would
look like a server that is down. :class:`HandshakeWatch` reads the sockets' monitor events
and turns a failed handshake into an :class:`AuthenticationError` that says what to fix, or,
when something other than a bertserve server answers (an HTTP server, the server's reply port
taken for its request port), into a :class:`WrongPortError` that names it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from .errors import AuthenticationError, BertClientError, WrongPortError
from .probe import REPLY_PORT, REQUEST_PORT, PeerProbe, Port
from .protocol import ANNOUNCE

CURVE_KEY_LENGTH = 40
"""Length of a z85-encoded CURVE key, and of the ``User-Id`` the authenticator gives a client."""

_Z85 = frozenset(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")

KeySource = str | bytes | os.PathLike[str]
"""A certificate file, or (where a public key will do) the z85 key itself."""


def is_z85_key(value: bytes) -> bool:
    """Whether ``value`` is a z85-encoded 32-byte key (40 characters of the z85 alphabet)."""
    return len(value) == CURVE_KEY_LENGTH and all(byte in _Z85 for byte in value)


def keygen(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Write a new certificate pair ``DIRECTORY/NAME.key`` and ``DIRECTORY/NAME.key_secret``.

    Creates ``directory`` (and its missing parents) mode 0700 if needed, whatever the umask,
    and returns ``(public_path, secret_path)``. The secret file is mode 0600 and the public
    one 0644 from the start: the pair is made in a private staging directory and linked into
    place. An existing pair is never overwritten (:class:`FileExistsError`). A server refuses
    key directories and files that others may write (see ``bertserve.server.security``).
    """
    if not name or name.startswith(".") or os.sep in name or (os.altsep and os.altsep in name):
        raise ValueError(f"a key name must be a plain file name, not {name!r}")
    folder = Path(directory)
    _private_directory(folder)
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    for path in (public, secret):
        if path.exists():
            raise FileExistsError(f"{path} already exists: refusing to overwrite a key pair; choose another name")
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=folder))  # mode 0700
    linked: list[Path] = []
    try:
        made_public, made_secret = zmq.auth.create_certificates(staging, name)
        os.chmod(made_secret, 0o600)
        os.chmod(made_public, 0o644)
        for made, final in ((made_secret, secret), (made_public, public)):
            os.link(made, final)  # fails, rather than overwrites, if another keygen got there first
            linked.append(final)
    except FileExistsError as exc:
        for path in linked:
            path.unlink()
        raise FileExistsError(f"{exc.filename} already exists: refusing to overwrite a key pair") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return public, secret


def _private_directory(folder: Path) -> None:
    """Make ``folder`` and its missing parents mode 0700 (``mkdir`` alone would follow the
    umask, which may let others add keys); an existing directory is left as it is."""
    missing = []
    for path in (folder, *folder.parents):
        if path.exists():
            break
        missing.append(path)
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another keygen made it meanwhile
            path.mkdir(mode=0o700)
            os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a directory")


def load_public_key(path_or_z85: KeySource) -> bytes:
    """The z85 public key in a certificate file (``.key`` or ``.key_secret``), or the key
    itself when given as 40 z85 characters. Anything else is a :class:`ValueError`."""
    if isinstance(path_or_z85, bytes):
        if is_z85_key(path_or_z85):
            return path_or_z85
        path_or_z85 = os.fsdecode(path_or_z85)
    path = os.fspath(path_or_z85)
    if os.path.isfile(path):
        return _read_certificate(path)[0]
    if is_z85_key(path.encode("utf-8", "replace")):
        return path.encode("ascii")
    raise ValueError(f"{path!r} is neither a certificate file (NAME.key) nor a 40-character z85 public key")


def load_secret_cert(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """``(public, secret)``, the z85 keys in a secret certificate file (``NAME.key_secret``)."""
    public, secret = _read_certificate(path)
    if secret is None:
        raise ValueError(f"{os.fspath(path)} holds no secret key: pass the NAME.key_secret file, not NAME.key")
    return public, secret


def _read_certificate(path: str | os.PathLike[str]) -> tuple[bytes, bytes | None]:
    where = os.fspath(path)
    if not os.path.isfile(where):
        raise ValueError(f"no certificate file at {where}")
    try:
        public, secret = zmq.auth.load_certificate(where)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the certificate {where}: {exc}") from exc
    if not is_z85_key(public) or (secret is not None and not is_z85_key(secret)):
        raise ValueError(f"{where} is not a ZeroMQ CURVE certificate: its keys are not 40 z85 characters")
    return public, secret


ROUTE_ID_BYTES = 16
"""Length of the random routing id of a client's reply ``DEALER`` under CURVE."""


def reply_socket(context: zmq.Context, topic: bytes, *, routed: bool) -> zmq.Socket:
    """The socket a client reads replies to client ids starting with ``topic`` from, not yet
    connected: a ``SUB`` subscribed to ``topic``, or with ``routed`` (a CURVE server) a
    ``DEALER`` with a random routing id, on which :func:`announce` tells the server the topic.

    The routing id is 16 random bytes (never starting with a zero byte, which libzmq keeps
    for ids it makes itself): it travels only inside CURVE's encryption, so no other peer
    can connect under it and take this client's route over.
    """
    if not routed:
        sock = context.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, topic)
    else:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, b"\x01" + os.urandom(ROUTE_ID_BYTES - 1))
    sock.setsockopt(zmq.LINGER, 0)
    return sock


def announce(sock: zmq.Socket, topic: bytes) -> None:
    """Tell the server (again) that replies to ``topic`` go to this ``DEALER`` from
    :func:`reply_socket`. Cheap and idempotent, so clients announce before every request: a
    restarted server learns the route with the first one. A full queue (no server) skips it."""
    if sock.type != zmq.DEALER:
        return
    with contextlib.suppress(zmq.Again):
        sock.send_multipart([ANNOUNCE, topic], zmq.NOBLOCK)


_WATCHED = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_CONNECTED
    | zmq.EVENT_DISCONNECTED
)
# How much a failure tells: a racing disconnect can hide the real reason (a bare "broken
# pipe" instead of the mechanism mismatch), so a vaguer event never replaces a clearer one.
_RANK: dict[int, int] = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: 1,
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: 2,
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: 3,
}
_CURVE_OPTIONS = "server_key and client_cert (--server-key and --client-cert; see `bertserve keygen`)"
# The server's port each kind of client socket connects to, which a failed handshake there has
# a PeerProbe look at. A DEALER may be a client's reply socket under CURVE (whose peer tells its
# socket type to keys only) or a remote worker's link: it is not probed.
_PORTS: dict[int, Port] = {zmq.PUSH: REQUEST_PORT, zmq.SUB: REPLY_PORT}
STALLED_AFTER_S = 0.3
"""How long a connection may go without its handshake done before the watch looks at what
answers there: ZeroMQ's handshake takes a few round trips, and an HTTP server never ends it."""


class HandshakeWatch:
    """Monitors the handshakes of a client's connected sockets; start it before ``connect``.

    ``sockets`` maps each server address to the socket that connects there; ``public_key``
    is the client's CURVE public key, or ``None`` without CURVE. Register :attr:`monitors`
    in the client's poller and call :meth:`drain` when one is readable: only connections
    and handshakes make events, so this costs nothing on a healthy connection. :meth:`error`
    is the failure to report, if any; :meth:`close` (before the sockets close) is idempotent.

    A handshake that failed, or a connection whose handshake has not ended within
    :data:`STALLED_AFTER_S`, at the request port (a ``PUSH``) or the reply port (a ``SUB``) may
    mean something other than a bertserve server answers there: :meth:`error` then has a
    :class:`~bertserve.client.probe.PeerProbe` look, and names what it finds in a
    :class:`WrongPortError`.
    """

    def __init__(
        self, sockets: Mapping[str, zmq.Socket], *, public_key: bytes | None, keys_dir: str = "clients/"
    ) -> None:
        self.public_key = public_key
        self.keys_dir = keys_dir  # where the server lists keys like this one
        self._failures: dict[str, tuple[int, int]] = {}  # address -> (event, value), until it succeeds
        self._vague: dict[str, int] = {}  # address -> failures without detail, until it succeeds
        self._connected: dict[str, float] = {}  # address -> when a connection was seen, until its handshake ends
        self._suspects: set[str] = set()  # addresses whose handshake failed with no word of CURVE
        self._probes: dict[str, PeerProbe] = {}  # what answers at a suspect address, until it succeeds
        self._ports: dict[str, Port] = {}  # the server's port each probed address should be
        self._watched: list[tuple[zmq.Socket, zmq.Socket, str]] = []
        try:
            for address, sock in sockets.items():
                endpoint = f"inproc://bertserve-monitor-{uuid.uuid4().hex}"
                monitor = sock.context.socket(zmq.PAIR)
                monitor.setsockopt(zmq.LINGER, 0)
                # libzmq blocks the connection's I/O thread when a monitor's queue is full;
                # events only come from connections and handshakes, and every wait drains them.
                monitor.setsockopt(zmq.RCVHWM, 0)
                sock.monitor(endpoint, _WATCHED)
                monitor.connect(endpoint)
                self._watched.append((sock, monitor, address))
                if (port := _PORTS.get(int(sock.type))) is not None:
                    self._ports[address] = port
        except BaseException:
            self.close()
            raise

    @property
    def monitors(self) -> list[zmq.Socket]:
        """The monitor sockets, to poll for ``POLLIN`` beside the client's own."""
        return [monitor for _, monitor, _ in self._watched]

    def drain(self) -> None:
        """Read every queued event, remembering the clearest failed handshake of each
        address since its last successful one."""
        now = time.monotonic()
        for _, monitor, address in self._watched:
            while monitor.poll(0):
                message = recv_monitor_message(monitor, zmq.NOBLOCK)
                event, value = int(message["event"]), int(message["value"])
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._succeeded(address)
                elif event == zmq.EVENT_CONNECTED:
                    self._connected[address] = now
                elif event == zmq.EVENT_DISCONNECTED:
                    if self._connected.pop(address, None) is not None:  # gone before its handshake ended
                        self._suspects.add(address)
                else:
                    self._failed(address, event, value)

    def error(self, *, certain_only: bool = False) -> BertClientError | None:
        """The failed handshake to report, after draining the events.

        Something other than a bertserve server at an address (:class:`WrongPortError`) is
        reported first, once a probe has told what answers there. With ``certain_only`` only
        failures that retrying cannot cure count, and none while a probe is still looking: a
        refused key, a mismatched security mechanism, and a handshake that failed without
        detail twice in a row (a wrong ``server_key`` does that on every attempt, and so can a
        plain client that a CURVE server hangs up on before the mismatch is told; once may be a
        race that hid a clearer reason). Otherwise a bare handshake failure counts only when
        the wait has run out anyway.
        """
        self.drain()
        self._look(time.monotonic())
        for address, port in self._ports.items():  # the request port first
            probe = self._probes.get(address)
            found = probe.peer.instead_of(port) if probe is not None and probe.peer is not None else None
            if found is not None:
                return WrongPortError(_wrong_port(address, port, found), address=address)
        if certain_only and not all(probe.done for probe in self._probes.values()):
            return None
        failures = [
            (_RANK[event], address, event, value)
            for address, (event, value) in self._failures.items()
            if not certain_only or event != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL or self._vague.get(address, 0) >= 2
        ]
        if not failures:
            return None
        _, address, event, value = max(failures)
        return AuthenticationError(self._describe(address, event, value), address=address)

    def close(self) -> None:
        """Stop monitoring and close the monitor sockets; calling it again does nothing."""
        watched, self._watched = self._watched, []
        for probe in self._probes.values():
            probe.close()
        for sock, monitor, _ in watched:
            if not sock.closed:
                sock.disable_monitor()
            monitor.close(linger=0)

    def _succeeded(self, address: str) -> None:
        self._failures.pop(address, None)
        self._vague.pop(address, None)
        self._connected.pop(address, None)
        self._suspects.discard(address)
        if (probe := self._probes.pop(address, None)) is not None:
            probe.close()

    def _failed(self, address: str, event: int, value: int) -> None:
        self._connected.pop(address, None)
        # A refused key, or a plain client that a CURVE server told of the mismatch: what
        # answers is a CURVE socket, which a probe could tell no more of.
        told_curve = event == zmq.EVENT_HANDSHAKE_FAILED_AUTH or (
            self.public_key is None and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
        )
        if not told_curve:
            self._suspects.add(address)
        if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            self._vague[address] = self._vague.get(address, 0) + 1
        if _RANK[event] >= _RANK[self._failures.get(address, (event, 0))[0]]:
            self._failures[address] = (event, value)

    def _look(self, now: float) -> None:
        """Start a probe of each suspect address (one whose connection has stalled, too) that
        has none, and move every probe on."""
        for sock, _, address in self._watched:
            connected = self._connected.get(address)
            if connected is not None and now - connected >= STALLED_AFTER_S:
                self._suspects.add(address)
            if address in self._suspects and address in self._ports and address not in self._probes:
                self._probes[address] = PeerProbe(sock.context, address, ipv6=bool(sock.get(zmq.IPV6)), now=now)
        for address, probe in self._probes.items():
            if probe.done:
                continue
            probe.advance(now)
            mechanism = probe.peer.mechanism if probe.peer is not None else None
            if mechanism is not None and (mechanism == "CURVE") != (self.public_key is not None):
                # What a racing disconnect may have hidden: one side uses CURVE, the other not.
                self._failed(address, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)

    def _describe(self, address: str, event: int, value: int) -> str:
        key = self.public_key
        curve = key is not None
        server = f"the bertserve server at {address}"
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            if key is not None:
                return (
                    f"{server} refused this client's key {key.decode('ascii')} "
                    f"(ZAP status {value}): its public certificate (NAME.key) must be in the server's "
                    f"{self.keys_dir} directory"
                )
            return f"{server} refused this client (ZAP status {value})"
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                if curve:
                    return f"{server} does not use CURVE: connect without {_CURVE_OPTIONS}"
                return f"{server} requires CURVE: pass {_CURVE_OPTIONS}"
            hint = ": check that server_key is this server's public key" if curve else ""
            return f"the handshake with {server} failed (ZeroMQ protocol error {value:#x}){hint}"
        if curve:
            return (
                f"the CURVE handshake with {server} failed: server_key is probably not this server's "
                "public key, or the server does not use CURVE"
            )
        reason = os.strerror(value) if value > 0 else "no detail"
        return f"the handshake with {server} failed ({reason}): it probably requires CURVE: pass {_CURVE_OPTIONS}"


def _wrong_port(address: str, port: Port, found: str) -> str:
    """The message for ``address``, where ``found`` answers instead of the server's ``port``."""
    return (
        f"{address} is not a bertserve {port.name}: {found}. "
        f"Point the client at the server's {port.name}: its {port.flag}, {port.default} by default"
    )
