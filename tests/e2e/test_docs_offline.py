"""/docs and /redoc render in headless Chromium with every host but loopback unreachable."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
from support import FakeBackend, ServedApp

from gateway.app import create_app
from gateway.settings import Settings

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # No network: every name except the loopback address fails to resolve, so a page
    # that needs a CDN renders blank.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--virtual-time-budget=15000",
]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed: `make test` installs it (apt package chromium)")
    return found


@pytest.fixture(scope="module")
def docs_server() -> Iterator[ServedApp]:
    served = ServedApp(create_app(Settings(), backend_factory=lambda *_: FakeBackend())).start()
    yield served
    served.stop()


def dump_dom(url: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


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

    html = get_swagger_ui_html(openapi_url=f"{docs_server.url}/openapi.json", title="cdn").body.decode()
    with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False) as page:
        page.write(html)
    dom = dump_dom(f"file://{page.name}")
    assert "opblock" not in dom
