"""The head's worker link: remote workers join the ventilator over tcp.

One ROUTER socket on ``--worker-port`` carries everything between the head and each host of
remote workers (``bertserve worker``, :mod:`.remote`): the handshake, jobs, credits,
heartbeats both ways and results. A host connects one DEALER and speaks for the worker
processes on its machine; each of them enters the registry like a local worker, keyed
``<host routing id>/<its identity>``, and gets jobs by the same credits.

- **Handshake.** A host's HELLO names its link version and the sha256 of its model files;
  the head answers WELCOME with the model options every worker must run (so all run the
  same model, pooling and dtype), or REFUSED saying why (another link version, other model
  files). A message from a host the head does not know (it restarted, or forgot the host)
  is answered BYE: the host joins again.
- **Liveness.** The head sends each host a heartbeat every second; a host passes on its
  workers' heartbeats and sends its own. A host silent for ``heartbeat_timeout_ms`` is
  forgotten, and its workers' jobs go to other workers (the registry counts an attempt
  against each, as for a local worker that dies).
- **Late results.** A result is passed to the sink only while its worker still holds the
  job; one from a forgotten worker, or for a job that went elsewhere, is dropped, so nothing
  is counted twice.
- **Leaving.** A host that stops sends DRAIN (its workers get nothing new, and finish what
  they hold), then BYE: the head takes back what they still hold, without counting it
  against the jobs.

Under CURVE the socket is a CURVE server in the ZAP domain ``workers``: only keys in the key
directory's ``workers/`` may join.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq
from bertserve.client import __version__
from bertserve.client import protocol as p

from ..config import HEARTBEAT_INTERVAL_MS, ModelConfig, ServerConfig

if TYPE_CHECKING:
    from .ventilator import Ventilator

logger = logging.getLogger("bertserve.link")

_REJOIN_INTERVAL_S = 1.0  # at most one BYE a second to a host the head does not know


@dataclass
class Host:
    routing_id: bytes
    hostname: str
    last_seen: float
    draining: bool = False


def welcome_options(config: ServerConfig) -> dict[str, Any]:
    """What a host needs from the head to run the head's model: its model options (the
    model directory and graph cache are the host's own) and model class."""
    model = {
        key: value
        for key, value in config.public().items()
        if key in _MODEL_FIELDS and key not in ("model_dir", "tuned_model_dir", "graph_dir", "device")
    }
    return {
        "model": model,
        "model_class": config.model_class,
        "tuned": config.model.tuned_model_dir is not None,
        "heartbeat_timeout_ms": config.heartbeat_timeout_ms,
    }


_MODEL_FIELDS = frozenset(field.name for field in dataclasses.fields(ModelConfig))


class WorkerLink:
    """The head's side of the worker link; the ventilator polls :attr:`socket` and calls
    :meth:`handle` with what it reads, and :meth:`tick` from its loop."""

    def __init__(self, config: ServerConfig, context: zmq.Context, ventilator: Ventilator, model_sha256: str,
                 curve_keys: Any = None) -> None:  # fmt: skip
        assert config.worker_port is not None
        self.config = config
        self.ventilator = ventilator
        self.model_sha256 = model_sha256
        self.welcome = p.dumps(welcome_options(config))
        self.hosts: dict[bytes, Host] = {}
        self.timeout_s = config.heartbeat_timeout_ms / 1000
        self._next_beat = 0.0
        self._told_to_rejoin: dict[bytes, float] = {}
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.router_mandatory = True
        if curve_keys is not None:
            from ..security import WORKER_DOMAIN, make_curve_server

            make_curve_server(self.socket, curve_keys)
            self.socket.zap_domain = WORKER_DOMAIN.encode()
        self.address = f"tcp://{config.bind}:{config.worker_port}"
        self.socket.bind(self.address)

    def close(self) -> None:
        self.socket.close()

    # -- what hosts send -------------------------------------------------------------------

    def handle(self, frames: list[zmq.Frame]) -> None:
        """One message from a host: ``[routing id, kind, ...]``."""
        if len(frames) < 2:
            return
        host_id, kind = frames[0].bytes, frames[1].bytes
        host = self.hosts.get(host_id)
        if kind == p.HELLO:
            self._on_hello(host_id, frames[2:])
            return
        if host is None:
            self._tell_to_rejoin(host_id)
            return
        host.last_seen = time.monotonic()
        try:
            self._dispatch(host, kind, frames[2:])
        except (p.ProtocolError, KeyError, TypeError, ValueError, IndexError) as exc:
            logger.error("dropped a malformed %r message from host %s: %s", kind[:16], host.hostname, exc)

    def _dispatch(self, host: Host, kind: bytes, rest: list[zmq.Frame]) -> None:
        vent = self.ventilator
        if kind == p.HEARTBEAT:
            if rest:
                vent.registry.heartbeat(self._key(host, rest[0].bytes), time.monotonic())
        elif kind == p.DONE:
            info = p.loads(rest[0].bytes)
            if not isinstance(info, dict):
                raise p.ProtocolError("DONE is not a JSON object")
            info["worker"] = self._key(host, str(info["worker"]).encode()).decode("utf-8", "replace")
            vent.job_done(info)
        elif kind in (p.RESULT, p.JOB_ERROR):
            key, job_id = self._key(host, rest[0].bytes), rest[1].bytes
            if vent.registry.holds(key, job_id.decode("utf-8", "replace")):
                vent.to_sink([kind, job_id, *rest[2:]])
            else:
                logger.debug("dropped a late result of job %r from %r: the job is no longer its", job_id, key)
        elif kind == p.READY:
            info = p.loads(rest[1].bytes)
            if not isinstance(info, dict):
                raise p.ProtocolError("READY is not a JSON object")
            info.setdefault("hostname", host.hostname)
            info["version"] = vent.version  # its files are the head's (checked); a head with a link never swaps
            if isinstance(info.get("model"), dict):  # the same files (checked), wherever they are there
                info["model"]["model_dir"] = self.config.model.model_dir
            key = self._key(host, rest[0].bytes)
            if key in vent.registry.workers:  # registered again: what it held is not coming back
                vent.hand_back(key)
            worker = vent.registry.add(key, info, time.monotonic(), host=host.routing_id)
            worker.draining = host.draining
            logger.info("remote worker %d on %s (%s) joined with %d credit(s)", worker.index, worker.hostname,
                        worker.device or "?", worker.credits)  # fmt: skip
        elif kind == p.GONE:
            reason = rest[1].bytes.decode("utf-8", "replace")[:200] if len(rest) > 1 else "its process died"
            vent.lose_worker(self._key(host, rest[0].bytes), f"remote worker on {host.hostname}: {reason}")
        elif kind == p.DRAIN:
            host.draining = True
            for worker in vent.registry.of_host(host.routing_id):
                worker.draining = True
            logger.info("host %s is stopping: its workers finish what they hold and get nothing new", host.hostname)
        elif kind == p.BYE:
            self._forget(host, None)
            logger.info("host %s left", host.hostname)
        else:
            raise p.ProtocolError(f"unexpected message {kind[:32]!r}")

    def _on_hello(self, host_id: bytes, rest: list[zmq.Frame]) -> None:
        try:
            hello = p.loads(rest[0].bytes) if rest else None
            if not isinstance(hello, dict):
                raise p.ProtocolError("HELLO is not a JSON object")
        except p.ProtocolError as exc:
            logger.error("dropped a malformed HELLO from %r: %s", host_id, exc)
            return
        hostname = str(hello.get("hostname", "?"))[:255]
        error = self._refusal(hello)
        if error is not None:
            logger.error("refused host %s: %s", hostname, error)
            self._send([host_id, p.REFUSED, p.dumps({"error": error})])
            return
        old = self.hosts.get(host_id)
        if old is not None:  # said HELLO again: what it had is gone
            self._forget(old, "it joined again")
        self.hosts[host_id] = Host(host_id, hostname, time.monotonic())
        self._told_to_rejoin.pop(host_id, None)
        logger.info("host %s joined (bertserve %s, %s worker(s))", hostname, hello.get("version"), hello.get("workers"))
        self._send([host_id, p.WELCOME, self.welcome])

    def _refusal(self, hello: dict[str, Any]) -> str | None:
        if hello.get("link") != p.LINK_VERSION:
            return (
                f"the worker speaks link version {hello.get('link')} (bertserve {hello.get('version')}); this head "
                f"speaks {p.LINK_VERSION} (bertserve {__version__}): run the same bertserve version on both"
            )
        if hello.get("model_sha256") != self.model_sha256:
            return (
                f"the worker's model files (sha256 {str(hello.get('model_sha256'))[:16]}...) differ from the head's "
                f"(sha256 {self.model_sha256[:16]}...): give the worker the same model directory as the head "
                f"(--model-dir{' and --tuned-model-dir' if self.config.model.tuned_model_dir else ''})"
            )
        return None

    def _tell_to_rejoin(self, host_id: bytes) -> None:
        now = time.monotonic()
        if now - self._told_to_rejoin.get(host_id, -_REJOIN_INTERVAL_S) >= _REJOIN_INTERVAL_S:
            if len(self._told_to_rejoin) > 10_000:
                self._told_to_rejoin.clear()
            self._told_to_rejoin[host_id] = now
            self._send([host_id, p.BYE])

    @staticmethod
    def _key(host: Host, name: bytes) -> bytes:
        return host.routing_id + b"/" + name

    # -- what the head sends ---------------------------------------------------------------

    def send_job(self, host: bytes, name: bytes, frames: list[Any]) -> None:
        """``[JOB, job_id, header, payload]`` to worker ``name`` of ``host``; raises
        ``zmq.ZMQError`` if the host cannot be reached."""
        self.socket.send_multipart([host, frames[0], name, *frames[1:]], zmq.NOBLOCK)

    def forget_worker(self, host: bytes, name: bytes, reason: str) -> None:
        """The head forgot this worker (it stopped answering): its host kills and replaces it."""
        self._send([host, p.FORGET, name, reason.encode()])

    def _send(self, frames: list[Any]) -> bool:
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # gone, or not taking more: its silence will tell
            return False

    def tick(self, now: float) -> None:
        """Heartbeats to every host, and forget hosts that fell silent."""
        if now < self._next_beat:
            return
        self._next_beat = now + HEARTBEAT_INTERVAL_MS / 1000
        for host in list(self.hosts.values()):
            silent = now - host.last_seen
            if silent > self.timeout_s:
                logger.error("host %s sent nothing for %.1f s; forgetting it and its workers", host.hostname, silent)
                self._forget(host, f"its host {host.hostname} sent nothing for {silent:.1f} s")
            else:
                self._send([host.routing_id, p.HEARTBEAT])

    def _forget(self, host: Host, reason: str | None) -> None:
        """Forget ``host`` and its workers: their jobs run elsewhere. ``reason`` None: the host
        handed them back (they count as never run); else it was lost (an attempt each)."""
        self.hosts.pop(host.routing_id, None)
        for worker in self.ventilator.registry.of_host(host.routing_id):
            if reason is None:
                self.ventilator.hand_back(worker.identity)
            else:
                self.ventilator.lose_worker(worker.identity, reason)

    def stop(self) -> None:
        """The head is stopping: every host is told to join again (a head that comes back)."""
        for host_id in list(self.hosts):
            with contextlib.suppress(zmq.ZMQError):
                self.socket.send_multipart([host_id, p.BYE], zmq.NOBLOCK)
        self.hosts.clear()

    def stats(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [
            {"hostname": h.hostname, "draining": h.draining, "last_heartbeat_s": round(now - h.last_seen, 2),
             "workers": len(self.ventilator.registry.of_host(h.routing_id))}
            for h in self.hosts.values()
        ]  # fmt: skip
