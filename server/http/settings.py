"""What the HTTP process knows of the server it fronts: one frozen :class:`Settings`, built
by :mod:`.process` from the server's config, read by the application (:mod:`.app`) and its
layers (:mod:`.layers`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config.http import HTTP_HEADERS
from ..config.limits import REPLY_BYTES, REQUEST_TOKENS
from .bodies import BodyPace
from .catalog import ModelSettings
from .principals import Principals


@dataclass(frozen=True)
class Settings:
    """What the HTTP process needs to know about the server it fronts."""

    models: tuple[ModelSettings, ...]  # every served model (the head says which is the default)
    principals: Principals  # none: no key needed, and each peer address is a principal
    max_body_bytes: int
    max_bodies_bytes: int  # what the bodies in flight may hold at once (see .bodies)
    max_inputs: int
    request_timeout_s: float
    token_id_input: bool = False  # OpenAI-style token id arrays are taken, as ids of the model's vocabulary
    max_text_chars: int = 100_000  # characters in one input, checked before anything tokenizes it
    max_principal_bodies_bytes: int | None = None  # what one principal's bodies may hold at once (None: all)
    body_pace: BodyPace = field(default_factory=BodyPace)
    max_headers: int = HTTP_HEADERS
    metrics_principals: bool = False  # name each principal in /metrics (--metrics-principals)
    cors_origins: tuple[str, ...] = ()  # the origins a browser's page may call from (--cors-allow-origin)
    max_request_tokens: int = REQUEST_TOKENS  # tokens of model work in one request, counted before work
    max_reply_bytes: int = REPLY_BYTES  # largest answer, as JSON, counted before work
    auto_truncate: bool = False  # cut an over-long input where a request does not say (--auto-truncate)

    def cuts(self, truncate: bool | None) -> bool:
        """Whether a request's over-long input is cut: as its ``truncate`` says, else ``--auto-truncate``."""
        return self.auto_truncate if truncate is None else truncate

    traced: bool = False  # this process traces (tracing.setup ran): each request's span, its context sent on
