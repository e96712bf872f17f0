"""The plain ASGI layers around the HTTP API, outermost first: the request's id
(:mod:`.request_ids`), its trace (:mod:`.traced`, when the process traces), and
:class:`~.front.Front` (the limits every request passes, then CORS for
``--cors-allow-origin``, then the key and the body's limits, and the metrics of all)."""

from __future__ import annotations

import functools

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from .bodies import BodyBudget
from .front import Front
from .request_ids import RequestIds
from .schemas import CHUNKED_HEADER, TRUNCATED_HEADER, VERSION_HEADER
from .settings import Settings
from .traced import Traced

_UNTRACED = frozenset({"/health", "/ready", "/metrics", "/docs", "/redoc", "/openapi.json"})  # probes and pages


def add_layers(app: FastAPI, settings: Settings) -> None:
    """Wrap ``app`` in its layers (each added wraps those before it)."""
    cors = None
    if settings.cors_origins:  # inside Front's limits, so a preflight is held to them; before its key
        cors = functools.partial(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-Id", "traceparent", "tracestate"],
            expose_headers=[
                CHUNKED_HEADER,
                TRUNCATED_HEADER,
                VERSION_HEADER,
                "Retry-After",
                "WWW-Authenticate",
                "X-Request-Id",
            ],
            max_age=600,
        )
    app.add_middleware(
        Front,
        principals=settings.principals,
        limit=settings.max_body_bytes,
        budget=BodyBudget(settings.max_bodies_bytes, settings.max_principal_bodies_bytes),
        pace=settings.body_pace,
        max_headers=settings.max_headers,
        principal_metrics=settings.metrics_principals,
        cors=cors,
    )
    if settings.traced:  # around Front, so a request it refuses (or a preflight) is traced too
        routes = {path for route in app.routes if isinstance(path := getattr(route, "path", None), str)}
        app.add_middleware(Traced, routes=routes - _UNTRACED, untraced=_UNTRACED, untraced_under="/docs/")
    app.add_middleware(RequestIds)  # outermost: its id in every answer (a preflight's too) and log line
