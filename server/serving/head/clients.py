"""The clients' side of the ventilator: each request read, checked against its sender's key,
then admitted (queued, and registered with the sink) or answered at once: a refusal, an empty
request, or a control command. What is decided lives elsewhere (:mod:`..policy.admission`,
:mod:`.control`, :mod:`..protocol.formats`); this module carries it out on the requests' book, the
scheduler and the line to the sink it is given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import zmq
from bertserve.client import protocol as p

from ... import metrics
from ...config.server import ServerConfig
from ...security import message_user_id, request_allowed
from ..policy import admission
from ..policy.admission import Refusal
from ..protocol import legacy
from ..protocol.formats import LEGACY, NATIVE, ReplyFormat
from .control import Control
from .intake import admit
from .models import HeadModel, Models
from .outbox import SinkOutbox
from .registry import Registry
from .request_options import EncodeOptions
from .requests import Requests

logger = logging.getLogger("bertserve.ventilator")

STOPPING = "the server is shutting down: it takes no new requests"

_Command = Callable[[p.Request, bytes | None, ReplyFormat], None]


class Head(Protocol):
    """What answering clients reads of the head: the models it serves (each one's queue,
    prompts and the version new requests are pinned to), whether it takes new requests (not
    once it is stopping), and the CONFIG and STATUS answers;
    and the one thing it asks of it: to cancel."""

    @property
    def models(self) -> Models: ...

    @property
    def accepting(self) -> bool: ...

    def cancel(self, keys: set[str]) -> None: ...

    def describe(self, model: HeadModel | None = None) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any]: ...


class Clients:
    def __init__(
        self,
        config: ServerConfig,
        head: Head,
        *,
        registry: Registry,
        requests: Requests,
        outbox: SinkOutbox,
        control: Control,
        curve: bool,
        gateway_key: bytes | None,
    ) -> None:
        self.config = config
        self.head = head
        self.registry = registry  # read only: the model its workers reported
        self.requests = requests
        self.outbox = outbox
        self.control = control
        self.curve = curve
        self.gateway_key = gateway_key  # under CURVE, the HTTP front end's key: its callers are principals
        self.received = 0
        self.rejected: dict[str, int] = {}
        self._commands: dict[bytes, _Command] = {
            p.ENCODE: self._on_encode,
            p.CONFIG: self._on_config,
            p.STATUS: self._on_status,
            p.TERMINATE: self._on_terminate,
            p.RELOAD: self._on_reload,
            p.CANCEL: self._on_cancel,
        }

    def stats(self) -> dict[str, Any]:
        return {
            "requests_received": self.received,
            "requests_rejected": sum(self.rejected.values()),
            "rejections": dict(sorted(self.rejected.items())),
        }

    # -- clients -------------------------------------------------------------------------

    def handle(self, frames: list[zmq.Frame]) -> None:
        user_id = message_user_id(frames[0]) if self.curve and frames else None
        raw = [frame.bytes for frame in frames]
        fmt = LEGACY if self.config.legacy.legacy_clients and legacy.is_legacy(raw) else NATIVE  # bert-as-service 1.x's
        try:
            if fmt is LEGACY:
                request = legacy.decode_request(raw, show_tokens=self.config.legacy.show_tokens_to_client)
            else:
                request = p.decode_request(raw, payload=False)  # a busy server need not read the texts
        except p.ProtocolError as exc:
            self._count_rejection("protocol")
            client = p.decode_client_id(raw)
            if len(raw) > 1 and raw[1] == p.ENCODE:
                metrics.REQUESTS.labels(metrics.path_of(client or b""), "protocol", "").inc()
            logger.warning("rejected a malformed request from %r: %s", client, exc)
            if client is not None and len(raw) >= 3 and self._owns(user_id, client):
                request_id = int(raw[2]) if raw[2].isdigit() and len(raw[2]) <= 19 else -1
                self.outbox.publish(NATIVE, p.error_reply(client, request_id, f"malformed request: {exc}", "protocol"))
            return
        if not self._owns(user_id, request.client_id):
            # Its replies would go to another key's client: no answer, only a log line.
            self._count_rejection("spoofed")
            logger.warning("refused a request whose client id %r does not belong to key %s", request.client_id, user_id)
            return
        self._commands[request.command](request, user_id.encode() if user_id else None, fmt)

    def _owns(self, user_id: str | None, client_id: bytes) -> bool:
        return request_allowed(user_id, client_id, self.curve)

    def _count_rejection(self, kind: str) -> None:
        self.rejected[kind] = self.rejected.get(kind, 0) + 1
        metrics.REJECTIONS.labels(kind).inc()

    def _refuse(self, request: p.Request, fmt: ReplyFormat, refusal: Refusal, model: str = "") -> None:
        self._count_rejection(refusal.kind)
        if request.command == p.ENCODE:
            metrics.REQUESTS.labels(metrics.path_of(request.client_id), refusal.kind, model).inc()
        self.outbox.publish(fmt, fmt.refusal(request, refusal.message, refusal.kind))

    def _model(self, request: p.Request, fmt: ReplyFormat) -> HeadModel | None:
        """The model ``request`` names (else the default one); ``None`` once refused for naming
        one this server does not serve."""
        name, task = request.header.get("model"), request.header.get("task")
        models = self.head.models
        # a request that names no model gets the default model of its task (ENCODE without one asks for vectors)
        asked = task if task in p.TASKS else "embed" if request.command == p.ENCODE else None
        model = models.get(name, asked) if name is None or isinstance(name, str) else None
        if model is None:
            self._refuse(request, fmt, Refusal(self.head.models.unknown(name), p.UNKNOWN_MODEL))
        return model

    def _on_encode(self, request: p.Request, user: bytes | None, fmt: ReplyFormat) -> None:
        """An ENCODE, top to bottom: to a model the head serves and takes requests for; admitted
        (every check, once: :func:`.intake.admit`); then planned and queued (:meth:`.requests.Requests.queue`).
        A request refused, or empty, is answered at once."""
        self.received += 1
        if not self.head.accepting:  # stopping: told at once, rather than left to its timeout
            return self._refuse(request, fmt, Refusal(STOPPING, "shutdown"))
        model = self._model(request, fmt)
        if model is None:
            return None
        who = admission.principal(request.client_id, user, self.gateway_key)
        info = self.registry.model_info(model.name, model.version)
        taken = admit(
            request,
            model,
            who,
            info=info,
            held=self.requests,
            of_task=self.head.models.of_task,
        )
        if isinstance(taken, Refusal):
            return self._refuse(request, fmt, taken, model.name)
        if not taken.texts:
            return self._answer_empty(request, fmt, taken.options, model, info)
        refusal = self.requests.queue(request, fmt, model, who, taken)
        if refusal is not None:
            self._refuse(request, fmt, refusal, model.name)
        return None

    def _on_cancel(self, request: p.Request, user: bytes | None, fmt: ReplyFormat) -> None:
        """The client withdrew its request: its queued work is dropped, and it is answered as
        cancelled (nobody need read that). A request already answered is left alone."""
        key = self.requests.key_of(request.key)
        if key is not None:
            self.head.cancel({key})

    def _answer_empty(
        self, request: p.Request, fmt: ReplyFormat, options: EncodeOptions, model: HeadModel, info: dict[str, Any]
    ) -> None:
        dim = options.dimensions or int(info.get("output_dim", 0))
        shape = [0, 0, dim] if info.get("token_level") else [0, dim]
        header: dict[str, Any] = {"dtype": info.get("output_dtype", "float32"), "shape": shape}
        if request.header.get("show_tokens"):
            header["tokens"] = []
        if (version := model.version) is not None:
            header["model_version"] = version
        metrics.REQUESTS.labels(metrics.path_of(request.client_id), "ok", model.name).inc()
        self.outbox.publish(fmt, fmt.answer(request, header, b""))

    # -- control commands (answered by .control) -------------------------------------------

    def _on_config(self, request: p.Request, user: bytes | None, fmt: ReplyFormat) -> None:
        model = self._model(request, fmt)
        if model is not None:
            self.outbox.publish(fmt, fmt.answer(request, self.control.for_reader(self.head.describe(model), user)))

    def _on_status(self, request: p.Request, user: bytes | None, fmt: ReplyFormat) -> None:
        status = self.head.status()
        if fmt.status_with_config:  # bert-as-service's status holds its config too
            status = {**self.head.describe(), **status}
        status = self.control.for_reader(status, user)
        request_id = str(request.request_id).encode()
        self.outbox.send([p.STATUS, fmt.name, request.client_id, request_id, p.dumps(status)])

    def _on_terminate(self, request: p.Request, user: bytes | None, fmt: ReplyFormat) -> None:
        self._answer(request, fmt, self.control.terminate(user))

    def _on_reload(self, request: p.Request, user: bytes | None, fmt: ReplyFormat) -> None:
        model = self._model(request, fmt)
        if model is not None:
            self._answer(request, fmt, self.control.reload(request.header, user, model.version, model.name))

    def _answer(self, request: p.Request, fmt: ReplyFormat, answer: Refusal | dict[str, Any]) -> None:
        if isinstance(answer, Refusal):
            self._refuse(request, fmt, answer)
        else:
            self.outbox.publish(fmt, fmt.answer(request, answer))
