"""What the HTTP process knows of the server it fronts: one frozen :class:`Settings`, made of
the server's config's own parts (its HTTP part, :class:`..config.http.Http`, and the head's
bounds, :class:`..config.limits.Limits`) and what the HTTP process reads once at start (the
models' tokenizers, the principals), read by the application (:mod:`.app`) and its layers
(:mod:`.layers`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config.http import Http
from ..config.limits import Limits
from .bodies import BodyPace
from .catalog import ModelSettings
from .principals import Principals


@dataclass(frozen=True)
class Settings:
    """What the HTTP process needs to know about the server it fronts."""

    models: tuple[ModelSettings, ...]  # every served model (the head says which is the default)
    principals: Principals  # none: no key needed, and each peer address is a principal
    http: Http = field(default_factory=Http)  # the server's HTTP options (--http-*, --max-http-*, ...)
    limits: Limits = field(default_factory=Limits)  # the head's bounds, checked here first
    token_id_input: bool = False  # OpenAI-style token id arrays are taken, as ids of the model's vocabulary
    auto_truncate: bool = False  # cut an over-long input where a request does not say (--auto-truncate)
    traced: bool = False  # this process traces (tracing.setup ran): each request's span, its context sent on

    def cuts(self, truncate: bool | None) -> bool:
        """Whether a request's over-long input is cut: as its ``truncate`` says, else ``--auto-truncate``."""
        return self.auto_truncate if truncate is None else truncate

    @property
    def max_body_bytes(self) -> int:
        """Largest request body (:meth:`..config.http.Http.body_limit`)."""
        return self.http.body_limit(self.limits.message_bytes)

    @property
    def max_bodies_bytes(self) -> int:
        """What the bodies in flight may hold at once (see .bodies)."""
        return self.http.max_http_body_bytes_total

    @property
    def max_principal_bodies_bytes(self) -> int:
        """What one principal's bodies may hold at once."""
        return self.http.principal_body_limit(self.limits.message_bytes)

    @property
    def body_pace(self) -> BodyPace:
        return BodyPace(timeout_s=self.http.http_body_timeout_s, min_rate=self.http.http_body_min_rate)

    @property
    def max_headers(self) -> int:
        return self.http.max_http_headers

    @property
    def metrics_principals(self) -> bool:
        """Name each principal in /metrics (--metrics-principals)."""
        return self.http.metrics_principals

    @property
    def cors_origins(self) -> tuple[str, ...]:
        """The origins a browser's page may call from (--cors-allow-origin)."""
        return self.http.cors_allow_origin

    @property
    def max_inputs(self) -> int:
        return self.limits.request_size

    @property
    def request_timeout_s(self) -> float:
        return self.limits.request_timeout_ms / 1000

    @property
    def max_text_chars(self) -> int:
        """Characters in one input, checked before anything tokenizes it."""
        return self.limits.max_text_chars

    @property
    def max_request_tokens(self) -> int:
        """Tokens of model work in one request, counted before work."""
        return self.limits.max_request_tokens

    @property
    def max_reply_bytes(self) -> int:
        """Largest answer, as JSON, counted before work."""
        return self.limits.max_reply_bytes
