"""A client's options, checked once where they enter: host and ports, the timeout, the
identity its replies are addressed to, the CURVE keys it loads, the served model its
requests go to (:class:`ClientOptions`), and the options of each encode request
(:class:`EncodeOptions`).

``BertClient``, ``ConcurrentBertClient`` and ``AsyncBertClient`` all check here, so a bad
option fails the same way, before any socket is opened or anything is sent.
"""

from __future__ import annotations

import math
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..late import check_outputs
from ..protocol import ENCODE_OPTIONS, MODEL_NAME_PATTERN, TASKS, TRUNCATION_DIRECTIONS, check_texts
from ..security import CURVE_KEY_LENGTH, KeySource, load_public_key, load_secret_cert
from ..tasks import check_task

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


def tcp_address(host: str, port: int) -> str:
    """The ZeroMQ endpoint of ``port`` on ``host`` (an IPv6 address in brackets)."""
    bracketed = f"[{host}]" if ":" in host else host
    return f"tcp://{bracketed}:{port}"


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


def check_host(host: object) -> str:
    """``host`` if it is a non-empty string."""
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be a non-empty string, not {host!r}")
    return host


def check_output_fmt(output_fmt: object) -> str:
    """``output_fmt`` if it is ``"ndarray"`` or ``"list"``."""
    if output_fmt not in ("ndarray", "list"):
        raise ValueError(f'output_fmt must be "ndarray" or "list", not {output_fmt!r}')
    return str(output_fmt)


def check_port(name: str, port: object) -> int:
    """``port`` (the option called ``name``) if it is an int from 1 to 65535."""
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"{name} must be an int, not {type(port).__name__}")
    if not 0 < port < 65536:
        raise ValueError(f"{name} must be 1 to 65535, not {port}")
    return port


def check_port_out(port: int, port_out: object) -> int:
    """The reply port: ``port_out``, or ``port + 1`` when it is ``None``; never ``port``, as a
    server's reply port differs from its request port."""
    if port_out is not None:
        if (reply_port := check_port("port_out", port_out)) == port:
            raise ValueError(f"port and port_out are both {port}: a bertserve server's reply port is another")
        return reply_port
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


def check_model(model: object) -> str | None:
    """``model`` if it is ``None`` (the server's default model) or could name a served model
    (:data:`~bertserve.client.protocol.MODEL_NAME_PATTERN`). Whether the server serves it is
    the server's to say: it answers a name it does not serve with kind ``model``."""
    if model is None:
        return None
    if not isinstance(model, str):
        raise TypeError(f"model must be a string or None, not {type(model).__name__}")
    if not _MODEL_NAME.fullmatch(model):
        raise ValueError(
            f"model {model!r} is not a model name: letters, digits and ._:/-, starting with a letter or digit, "
            f"at most 128 characters ({MODEL_NAME_PATTERN})"
        )
    return model


def model_field(model: str | None) -> dict[str, str]:
    """The header field naming ``model``, none for the server's default: a request names a
    model only when its caller did."""
    return {} if model is None else {"model": model}


_MODEL_NAME = re.compile(MODEL_NAME_PATTERN)


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


@dataclass(frozen=True, kw_only=True)
class ClientOptions:
    """The options of one client, checked (:meth:`checked`): where its server is, how long a
    wait may take, what its answers look like, who it is, and the model its requests go to."""

    host: str
    port: int
    port_out: int
    timeout: float
    output_fmt: Literal["ndarray", "list"]
    identity: bytes
    curve: Curve | None
    check_version: bool
    check_length: bool
    show_server_config: bool
    model: str | None

    @property
    def address(self) -> str:
        """The server's request endpoint."""
        return tcp_address(self.host, self.port)

    @classmethod
    def checked(
        cls,
        host: str,
        port: int,
        port_out: int | None,
        *,
        timeout: float,
        output_fmt: Literal["ndarray", "list"],
        identity: bytes | str | None,
        check_version: bool,
        check_length: bool,
        show_server_config: bool,
        server_key: KeySource | None,
        client_cert: str | os.PathLike[str] | None,
        model: str | None,
    ) -> ClientOptions:
        """The options a client was given, each checked in turn: the first bad one raises
        ``ValueError`` or ``TypeError``, and a CURVE key file that cannot be read ``OSError``."""
        host = check_host(host)
        port = check_port("port", port)
        port_out = check_port_out(port, port_out)
        timeout = check_timeout(timeout)
        check_output_fmt(output_fmt)
        curve = load_curve(server_key, client_cert)
        return cls(
            host=host,
            port=port,
            port_out=port_out,
            timeout=timeout,
            output_fmt=output_fmt,
            identity=check_identity(identity, None if curve is None else curve.public),
            curve=curve,
            check_version=check_version,
            check_length=check_length,
            show_server_config=show_server_config,
            model=check_model(model),
        )


# -- the options of one encode call ------------------------------------------------------

LONG_INPUTS = ("truncate", "chunk")


@dataclass(frozen=True)
class EncodeOptions:
    """What one ``encode`` call asks of the server beside its texts, checked once, and the
    ENCODE header that carries it (:meth:`header`). Every request of the call (each chunk with
    ``show_progress``, each batch of ``encode_async``) carries the same options.

    - ``long_inputs``: ``"truncate"`` or ``"chunk"``, what the server does with an input longer
      than its ``max_seq_len`` (chunk: encode it in windows and combine their vectors);
    - ``dimensions``: keep the first ``k`` dimensions of each vector, from 1 to the model's
      dimension (renormalized if the server normalizes its output);
    - ``normalize``: ``True`` for unit-length vectors, ``False`` for a normalizing model's vectors
      before its Normalize module (its Dense layers applied); by default as the model's modules say;
    - ``prompt_name``: one of the server's prompts (``server_config["prompts"]``), put before
      every input; text inputs only;
    - ``truncation_direction``: ``"right"`` (the server's default) or ``"left"``, the end of an
      over-long input that is cut;
    - ``model``: the served model that encodes the texts (the client has already put its own
      in place of ``None``, which leaves it to the server's default);
    - ``task``: what the model is asked for (:data:`~bertserve.client.protocol.TASKS`); sent
      by ``rerank``, ``predict``, ``encode_sparse`` and ``encode_multivector``, and left out by
      ``encode`` (vectors);
    - ``is_query``: a multivector request's texts are queries (ColBERT reads them its own way);
    - ``outputs``: several outputs of a late-interaction model from one run, in one answer;
    - ``pairs``: whether an input holding ``|||`` is a sentence pair (the default) or one
      sentence. Never sent: without it :meth:`check_texts` writes each input so that the
      server sees one sentence (:func:`~bertserve.client.protocol.one_sentence`).

    Each is sent only when given (``None`` leaves it to the server). A value of the wrong type
    raises ``TypeError`` and one out of range ``ValueError``, here; :meth:`check_server` checks
    ``dimensions`` and ``prompt_name`` against what the configuration of ``model`` says it has.
    """

    is_tokenized: bool = False
    show_tokens: bool = False
    long_inputs: str | None = None
    dimensions: int | None = None
    prompt_name: str | None = None
    truncation_direction: str | None = None
    normalize: bool | None = None
    model: str | None = None
    pairs: bool = True
    task: str | None = None
    is_query: bool | None = None
    outputs: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("is_tokenized", "show_tokens", "pairs"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, not {getattr(self, name)!r}")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise TypeError(f"normalize must be True, False or None, not {self.normalize!r}")
        if self.long_inputs is not None and self.long_inputs not in LONG_INPUTS:
            raise ValueError(f"long_inputs must be None, 'truncate' or 'chunk', not {self.long_inputs!r}")
        _check_dimensions(self.dimensions)
        _check_prompt_name(self.prompt_name, self.is_tokenized)
        _check_truncation_direction(self.truncation_direction)
        check_model(self.model)
        if self.task is not None and self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, not {self.task!r}")
        if self.is_query is not None and not isinstance(self.is_query, bool):
            raise TypeError(f"is_query must be True, False or None, not {self.is_query!r}")
        if self.outputs is not None:
            check_outputs(self.outputs)
            if self.task is not None:
                raise ValueError("a request asks for a task or for outputs, not both")

    def check_texts(self, texts: object) -> list[Any]:
        """``texts`` as a list, checked (:func:`~bertserve.client.protocol.check_texts`), each
        a sentence pair or not as ``pairs`` says."""
        return check_texts(texts, self.is_tokenized, pairs=self.pairs)

    def check_server(self, config: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` if ``config``, the server's configuration of the model these
        options go to, says it cannot do what they ask: more dimensions than the model has, or
        a prompt it does not have. A server that does not say is left to answer for itself."""
        for task in [self.task] if self.task is not None else self.outputs or ():
            check_task(config, task, self.model)
        dim = config.get("output_dim")
        if (
            self.dimensions is not None
            and isinstance(dim, int)
            and not isinstance(dim, bool)
            and 0 < dim < self.dimensions
        ):
            dims = f"the model's {dim} dimensions" if self.model is None else f"the {dim} dimensions of {self._named}"
            raise ValueError(f"dimensions={self.dimensions} is more than {dims}: ask for 1 to {dim}")
        prompts = config.get("prompts")
        if self.prompt_name is not None and isinstance(prompts, dict) and self.prompt_name not in prompts:
            if not prompts:
                has = "the server has" if self.model is None else f"{self._named} has"
                raise ValueError(
                    f"unknown prompt_name {self.prompt_name!r}: {has} no prompts "
                    "(it takes them from its model directory, or from --prompt NAME=TEXT)"
                )
            known = ", ".join(repr(name) for name in sorted(prompts))
            whose = "the server's prompts" if self.model is None else f"the prompts of {self._named}"
            raise ValueError(f"unknown prompt_name {self.prompt_name!r}: {whose} are {known}")

    @property
    def _named(self) -> str:
        return f"model {self.model!r}"

    def chunks_long_inputs(self, config: Mapping[str, Any]) -> bool:
        """Whether the server will encode over-long inputs in windows rather than cut them."""
        return self.long_inputs == "chunk" or (self.long_inputs is None and config.get("long_inputs") == "chunk")

    def header(self, timeout_ms: float) -> dict[str, Any]:
        """The fields of an ENCODE header for these options. ``timeout_ms`` is how long the
        client waits for the answer: the server drops the work once that has passed."""
        header: dict[str, Any] = {
            "is_tokenized": self.is_tokenized,
            "show_tokens": self.show_tokens,
            "timeout_ms": max(1, math.ceil(timeout_ms)),
        }
        for name in _SENT_WHEN_GIVEN:
            if (value := getattr(self, name)) is not None:
                header[name] = value
        return {**header, **model_field(self.model)}


# The protocol's request options, but the deadline that every request carries, are fields above.
_SENT_WHEN_GIVEN = tuple(name for name in ENCODE_OPTIONS if name != "timeout_ms")


def _check_dimensions(dimensions: object) -> None:
    if dimensions is None:
        return
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        raise TypeError(f"dimensions must be an int, not {type(dimensions).__name__}")
    if dimensions < 1:
        raise ValueError(f"dimensions must be at least 1, not {dimensions}")


def _check_prompt_name(prompt_name: object, is_tokenized: bool) -> None:
    if prompt_name is None:
        return
    if not isinstance(prompt_name, str):
        raise TypeError(f"prompt_name must be a string, not {type(prompt_name).__name__}")
    if not prompt_name:
        raise ValueError("prompt_name must not be empty: pass None for the server's default prompt")
    if is_tokenized:
        raise ValueError("prompt_name needs text inputs: tokenized inputs are encoded as they are")


def _check_truncation_direction(direction: object) -> None:
    if direction is None:
        return
    if not isinstance(direction, str):
        raise TypeError(f"truncation_direction must be a string, not {type(direction).__name__}")
    if direction not in TRUNCATION_DIRECTIONS:
        raise ValueError(f"truncation_direction must be 'right' or 'left', not {direction!r}")
