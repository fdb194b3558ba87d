"""/docs and /redoc render in headless Chromium with every host but loopback unreachable."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import pytest

from gateway.app import create_app
from gateway.settings import Settings

from helpers.chromium import dump_dom
from helpers.support import FakeBackend, ServedApp


@pytest.fixture(scope="module")
def docs_server() -> Iterator[ServedApp]:
    settings = Settings()
    served = ServedApp(create_app(settings, backend_factory=lambda *_: FakeBackend()), settings).start()
    yield served
    served.stop()


def test_swagger_ui_renders_offline(docs_server: ServedApp) -> None:
    dom = dump_dom(f"{docs_server.url}/docs")
    assert "swagger-ui" in dom
    # Rendered from /openapi.json by the locally served bundle: the operations are in the DOM.
    assert "opblock" in dom
    assert "/classify" in dom
    assert "/readyz" in dom


def test_redoc_renders_offline(docs_server: ServedApp) -> None:
    dom = dump_dom(f"{docs_server.url}/redoc")
    assert "Classify images" in dom
    assert "application/problem+json" in dom


def test_blank_page_when_assets_are_missing_is_detected(docs_server: ServedApp) -> None:
    # The check itself can fail: a page loading Swagger UI from a CDN renders nothing here.
    from fastapi.openapi.docs import get_swagger_ui_html

    html = bytes(
        get_swagger_ui_html(openapi_url=f"{docs_server.url}/openapi.json", title="cdn").body
    ).decode()
    with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False) as page:
        page.write(html)
    dom = dump_dom(f"file://{page.name}")
    assert "opblock" not in dom
