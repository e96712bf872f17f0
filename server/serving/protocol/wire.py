"""The server's internal frames: between its processes, and between a head and the hosts of
remote workers. Clients never see them; the frames clients and servers exchange are
:mod:`bertserve.client.protocol`, whose JSON and array helpers and :class:`ProtocolError`
these share.

Inside the server (same version, never seen by clients)::

    ventilator PUSH -> sink PULL     [REGISTER, JSON {key, client (hex), request_id, count, deadline, ...}]
                                     (the bodies the sink reads are declared in :mod:`.sink`)
                                     [PUBLISH, client_id, request_id, status, header, *buffer]
                                     [FAIL, JSON {keys, error, kind}]
                                     [STATUS, client_id, request_id, JSON ventilator status]
                                     [STOP]   (shutdown: publish what is left, then exit)
    worker <-> ventilator (ROUTER for jobs, PULL for credits and heartbeats)
        worker DEALER -> ventilator  [READY, JSON {worker, pid, credits, model, version}]
        worker PUSH -> ventilator    [DONE, JSON {job, worker, seconds, tokens, slots}]   (returns the job's credit)
                                     [HEARTBEAT, worker identity]   (every second, from its own thread)
        ventilator -> worker         [JOB, job_id, JSON {parts, is_tokenized, show_tokens}, payload] | [STOP]
    worker PUSH -> sink PULL         [RESULT, job_id, JSON {parts, dtype, shape, tokens, lengths, truncated,
                                      model_version}, buffer]
                                     [JOB_ERROR, job_id, JSON {parts, error}]

Head and remote-worker hosts (``bertserve worker``), over one tcp link on ``--worker-port``,
versioned by :data:`LINK_VERSION`. A host connects one DEALER and speaks for the worker
processes on its machine, which talk to it as they would to a local ventilator and sink;
``W`` names one of them (its identity on that host)::

    host -> head   [HELLO, JSON {link, version, hostname, model_sha256, workers}]
                   [HEARTBEAT] (the host, every second) | [HEARTBEAT, W] (a worker's, passed on)
                   [READY, W, JSON {worker, pid, credits, model, device, hostname}]
                   [DONE, JSON {job, worker: W, ...}]
                   [RESULT, W, job_id, header, buffer] | [JOB_ERROR, W, job_id, header]
                   [GONE, W, reason] | [DRAIN] | [BYE]
    head -> host   [WELCOME, JSON {model, model_class, heartbeat_timeout_ms}] | [REFUSED, JSON {error}]
                   [HEARTBEAT] (every second) | [JOB, W, job_id, header, payload]
                   [FORGET, W, reason] | [BYE] (the head is stopping, or does not know this host: join again)

A job's ``parts`` is a list of ``{"key": request key, "rows": [row indexes in the request]}``
in the order the job's rows are laid out. A request key is ``"<client id as hex>#<request id>"``,
so any client id (1 to 64 arbitrary bytes) round-trips exactly.

``lengths`` holds the token count of each row of a job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bertserve.client.protocol import ProtocolError

# between the server's processes
REGISTER = b"REGISTER"
PUBLISH = b"PUBLISH"
FAIL = b"FAIL"
READY = b"READY"
DONE = b"DONE"
JOB = b"JOB"
STOP = b"STOP"
RESULT = b"RESULT"
JOB_ERROR = b"JOB_ERROR"
HEARTBEAT = b"HEARTBEAT"

# between a head and the hosts of remote workers (``bertserve worker``), over --worker-port
LINK_VERSION = 2  # 2: a RESULT says which rows' inputs were cut (truncated)
HELLO = b"HELLO"  # host -> head: {link, version, hostname, model_sha256, workers}
WELCOME = b"WELCOME"  # head -> host: the model options every worker runs
REFUSED = b"REFUSED"  # head -> host: {error}; the host exits
DRAIN = b"DRAIN"  # host -> head: send my workers nothing new, I am stopping
BYE = b"BYE"  # host -> head: take back what my workers hold; head -> host: join again
FORGET = b"FORGET"  # head -> host: this worker stopped answering; kill it
GONE = b"GONE"  # host -> head: this worker process died


def split_message(frames: Sequence[Any], expected: dict[bytes, int]) -> tuple[bytes, list[Any]]:
    """``(kind, rest)`` of an internal message, checking its frame count for ``kind``."""
    if not frames:
        raise ProtocolError("empty message")
    kind = bytes(frames[0])
    if kind not in expected:
        raise ProtocolError(f"unexpected message {kind[:32]!r}")
    rest = [bytes(f) if not isinstance(f, memoryview) else f for f in frames[1:]]
    if expected[kind] >= 0 and len(rest) != expected[kind]:
        raise ProtocolError(f"{kind.decode()} has {len(rest)} frames, expected {expected[kind]}")
    return kind, rest


@dataclass(frozen=True)
class Addresses:
    """Where the server's internal sockets live (ipc paths or tcp addresses)."""

    jobs: str  # ventilator ROUTER
    credits: str  # ventilator PULL
    sink: str  # sink PULL
