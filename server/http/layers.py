"""The plain ASGI layers around the HTTP API, outermost first: the request's id
(:mod:`.request_ids`), CORS (``--cors-allow-origin``), its trace (:mod:`.traced`, when the
process traces), and :class:`~.front.Front` (the key, the body's limits, the metrics)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from .bodies import BodyBudget
from .front import Front
from .request_ids import RequestIds
from .schemas import CHUNKED_HEADER, VERSION_HEADER
from .settings import Settings
from .traced import Traced

_UNTRACED = frozenset({"/health", "/ready", "/metrics", "/docs", "/redoc", "/openapi.json"})  # probes and pages


def add_layers(app: FastAPI, settings: Settings) -> None:
    """Wrap ``app`` in its layers (each added wraps those before it)."""
    app.add_middleware(
        Front,
        principals=settings.principals,
        limit=settings.max_body_bytes,
        budget=BodyBudget(settings.max_bodies_bytes, settings.max_principal_bodies_bytes),
        pace=settings.body_pace,
        max_headers=settings.max_headers,
        principal_metrics=settings.metrics_principals,
    )
    if settings.traced:  # around Front, so a request it refuses is traced too
        routes = {path for route in app.routes if isinstance(path := getattr(route, "path", None), str)}
        app.add_middleware(Traced, routes=routes - _UNTRACED, untraced=_UNTRACED, untraced_under="/docs/")
    if settings.cors_origins:  # outermost: a preflight is answered before Front asks for a key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-Id", "traceparent", "tracestate"],
            expose_headers=[CHUNKED_HEADER, VERSION_HEADER, "Retry-After", "WWW-Authenticate", "X-Request-Id"],
            max_age=600,
        )
    app.add_middleware(RequestIds)  # outermost: its id in every answer (a preflight's too) and log line
