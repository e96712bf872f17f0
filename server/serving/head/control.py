"""The answers to clients' control commands (CONFIG, STATUS, TERMINATE, RELOAD) and the
rule of who may run the administrative ones.

The ventilator reads the command and sends the answer; :class:`Control` decides it and owns
what the commands change: a stop asked for, and the RELOADs taken, which the version swap
takes in turn (:meth:`Control.take_reload`).

Under CURVE the administrative commands (TERMINATE, RELOAD) are taken from admin keys only
(``admins/``), whatever ``--allow-terminate`` says; and what CONFIG and STATUS say of this
machine (paths, process ids, host names: :data:`PRIVATE_FIELDS`) is for admin keys only:
any other key reads the same answer without them (:meth:`Control.for_reader`).
"""

from __future__ import annotations

import logging
from typing import Any

from bertserve.client import __version__, protocol as p

from ...config.server import ServerConfig
from ...security import loopback_only
from ..policy import costs
from ..policy.admission import Refusal

logger = logging.getLogger("bertserve.control")

PRIVATE_FIELDS = frozenset(
    {"model_dir", "tuned_model_dir", "graph_dir", "models_dir", "model_defaults", "pid", "host", "hostname"}
    | {"grpc_tls_cert", "grpc_tls_key", "grpc_tls_client_ca"}
)
"""Fields of CONFIG and STATUS, at any depth, that say where this server's files are and which
processes and machines run it: under CURVE, for admin keys only."""


def describe(config: ServerConfig, *, curve: bool, ready: bool, model: dict[str, Any]) -> dict[str, Any]:
    """The CONFIG answer: the server's options and the model its workers reported. The head's
    own fields (its version, protocol, readiness, CURVE and frame limit) come last, so nothing
    a worker reports stands in for them."""
    public = config.public()
    public.pop("curve_dir", None)  # where the server keeps its keys is nobody else's business
    return {
        **public,
        **model,
        "server_version": __version__,
        "protocol": p.PROTOCOL_VERSION,
        "ready": ready,
        "curve": curve,
        "max_message_bytes": config.message_limit,
        "max_reply_rows": costs.reply_rows(config.limits.max_reply_bytes, costs.reply_row_bytes(model)),
    }


def without_private(answer: Any) -> Any:
    """``answer`` without :data:`PRIVATE_FIELDS`, at any depth (a copy: ``answer`` is unchanged)."""
    if isinstance(answer, dict):
        return {key: without_private(value) for key, value in answer.items() if key not in PRIVATE_FIELDS}
    if isinstance(answer, list):
        return [without_private(value) for value in answer]
    return answer


class Control:
    """TERMINATE and RELOAD: who may send them, and what they ask for."""

    def __init__(self, config: ServerConfig, *, admins: frozenset[bytes] | None, remote_workers: bool) -> None:
        self.config = config
        self.curve = admins is not None
        self.admins = admins or frozenset()
        self.remote_workers = remote_workers  # a head with remote workers cannot swap their model files
        self.terminate_requested = False
        self.reloads = 0  # RELOAD commands taken, so a caller can tell when its own is answered
        self._reload: dict[str, str] = {}  # model -> "latest" or a version number, not yet taken by its swap
        if self.curve and config.security.allow_terminate is not None:
            logger.warning("--allow-terminate has no effect under CURVE: only the keys in admins/ may stop the server")

    def is_admin(self, user: bytes | None, allowed: bool | None = None) -> bool:
        """Whether a client may run an administrative command: admin keys under CURVE (whatever
        ``allowed`` says); else ``allowed`` if set, else anyone when the server listens on
        loopback only."""
        if self.curve:
            return user is not None and user in self.admins
        if allowed is not None:
            return allowed
        return loopback_only(self.config.ports.bind)

    def for_reader(self, answer: dict[str, Any], user: bytes | None) -> dict[str, Any]:
        """A CONFIG or STATUS answer as ``user`` may read it: whole for an admin key (or
        without CURVE, where nobody is authenticated), else without :data:`PRIVATE_FIELDS`."""
        if not self.curve or (user is not None and user in self.admins):
            return answer
        return dict(without_private(answer))

    def _forbidden(self, command: str) -> Refusal:
        why = "its key is not in the server's admins/" if self.curve else "it listens beyond loopback"
        return Refusal(f"this server does not accept {command} from clients: {why}", "forbidden")

    def terminate(self, user: bytes | None) -> Refusal | dict[str, Any]:
        if not self.is_admin(user, self.config.security.allow_terminate):
            return self._forbidden("TERMINATE")
        self.terminate_requested = True
        return {"stopping": True}

    def reload(
        self, header: dict[str, Any], user: bytes | None, version: int | None, model: str = ""
    ) -> Refusal | dict[str, Any]:
        """Check ``model``'s repository now (for ``version``, default the newest), and swap to
        what it finds; answered at once, the swap's progress is in the status."""
        if not self.is_admin(user):
            return self._forbidden("RELOAD")
        wanted = str(header.get("version", "latest")).lower()
        if version is None:
            return Refusal(
                "this server serves a model directory, not a repository of numbered versions (1/, 2/, "
                "...): there is no other version to load"
            )
        if self.remote_workers:
            return Refusal(
                "this server takes remote workers (--worker-port), whose model files it cannot swap; "
                "restart the head and the workers on the new version"
            )
        if wanted != "latest" and not (wanted.isdigit() and len(wanted) <= 9):
            return Refusal(f"version must be latest or a version number, not {wanted[:32]!r}")
        self._reload[model] = wanted
        self.reloads += 1
        return {"reload": self.reloads, "wanted": wanted, "model_version": version}

    def take_reload(self, model: str = "") -> tuple[str, int] | None:
        """The version the latest RELOAD of ``model`` asked for and the RELOAD count, once."""
        wanted = self._reload.pop(model, None)
        return None if wanted is None else (wanted, self.reloads)
