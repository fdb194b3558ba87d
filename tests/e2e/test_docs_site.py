"""The documentation site: the generated reference pages are current with the code,
`mkdocs build --strict` passes (broken links, anchors and pages left out of the nav fail
it), the README is a short front page whose links into the docs all resolve, and a built
page renders in headless Chromium with no network."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.chromium import dump_dom

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).with_name("mkdocs")


def test_generated_reference_pages_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "WARNING" not in result.stderr, result.stderr[-3000:]
    return out


def test_the_site_builds_strict_and_needs_no_network(site: Path) -> None:
    pages = list(site.rglob("*.html"))
    assert len(pages) >= 20
    for page in pages:
        html = page.read_text()
        assert "fonts.googleapis.com" not in html, page
        assert not re.search(r"<(script|link)[^>]+(src|href)=\"https?://", html), page


def test_a_page_renders_offline_in_chromium(site: Path) -> None:
    dom = dump_dom((site / "reference" / "errors" / "index.html").as_uri())
    assert "shared-state-unavailable" in dom  # generated from the error classes
    assert "Problem types" in dom


def test_the_readme_is_a_short_front_page_linking_into_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert readme.startswith("# triton-gateway\n\n```sh\nmake run")
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme)
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).is_file(), link


def test_every_docs_page_is_reachable_from_home_in_two_clicks(site: Path) -> None:
    """Home links to every section page, the nav to every page: the questions of the
    issue (add a model, an error type, a setting, tracing, a GPU host's size) each have a
    page linked from the home page itself."""
    home = (ROOT / "docs" / "index.md").read_text()
    for page in ("tutorials/own-classifier.md", "reference/errors.md", "reference/settings.md",
                 "how-to/tracing.md", "tutorials/gpu-host.md", "explanation/performance.md"):  # fmt: skip
        assert f"]({page})" in home, page


def test_the_openapi_document_renders_in_the_site_with_no_network(site: Path) -> None:
    """Swagger UI bundled into the site renders reference/openapi.json, served over loopback."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        (frame,) = (site / "reference" / "api").glob("swagger-*.html")
        dom = dump_dom(f"http://127.0.0.1:{server.server_address[1]}/reference/api/{frame.name}")
    finally:
        server.shutdown()
    assert "Classify images or texts with the default model of their kind" in dom
    assert "/models/{name}/rollout" in dom  # the admin routes are in the document too
