"""``/docs`` and ``/redoc`` of the HTTP API (``server/http/app.py``) load nothing from another
host, so they work offline; they and the schema need no API key, unlike the API itself."""

from __future__ import annotations

import re
from typing import Any

import pytest
from bertserve.server.config.http import Http
from bertserve.server.config.limits import Limits
from bertserve.server.http.app import DOCS_ASSETS, Settings, create_app
from bertserve.server.http.principals import Principal, Principals
from starlette.testclient import TestClient

KEY = "docs-test-key-0123456789"
_REFERENCE = re.compile(r"""(?:src|href)="([^"]+)"|url: '([^']+)'""")


@pytest.fixture(scope="module")
def http() -> TestClient:
    settings = Settings(
        models=(),
        principals=Principals([Principal.of("default", KEY)]),
        http=Http(max_http_body_bytes=1 << 20, max_http_body_bytes_total=1 << 22),
        limits=Limits(max_request_size=100, request_timeout_ms=5000),
    )

    async def no_gateway() -> Any:
        raise AssertionError("the documentation needs no server behind it")

    return TestClient(create_app(settings, no_gateway))  # no lifespan: nothing but the routes


def _references(html: str) -> list[str]:
    return [src or url for src, url in _REFERENCE.findall(html)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_pages_load_everything_from_this_server(http: TestClient, page: str) -> None:
    reply = http.get(page)  # without a key: a browser sends none
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/html")
    assert "://" not in reply.text.replace("window.location.origin", ""), reply.text  # no CDN, no web fonts
    references = _references(reply.text)
    assets = [ref for ref in references if ref.startswith(DOCS_ASSETS + "/")]
    assert len(assets) == (3 if page == "/docs" else 2), references  # script, style sheet and icon
    assert set(references) - set(assets) <= {"/openapi.json"}, references
    for asset in assets:
        served = http.get(asset)
        assert served.status_code == 200, asset
        assert len(served.content) > 1000, asset
    script = next(ref for ref in assets if ref.endswith(".js"))
    assert (b"SwaggerUIBundle" if page == "/docs" else b"Redoc") in http.get(script).content


def test_swagger_ui_reads_the_schemas_openapi_version(http: TestClient) -> None:
    """FastAPI writes OpenAPI 3.1, which Swagger UI renders from version 5 on."""
    schema = http.get("/openapi.json")
    assert schema.status_code == 200 and schema.json()["openapi"].startswith("3.1")
    bundle = http.get(DOCS_ASSETS + "/swagger-ui-bundle.js").content
    assert b"isOAS31" in bundle, "a Swagger UI older than 5, which shows no 3.1 schema"


def test_the_api_still_needs_the_key(http: TestClient) -> None:
    for path in ("/v1/models", "/status", "/metrics", "/documents", "/docsx"):
        assert http.get(path).status_code == 401, path
    reply = http.post("/v1/embeddings", json={"input": "x"})
    assert reply.status_code == 401
