"""Clients that offer to upgrade the connection, on the real stack: curl's ``--http2``
over http:// (Debian's curl sends ``Connection: Upgrade, HTTP2-Settings`` and ``Upgrade:
h2c`` with every request, its body included) and the way Java's RestClient and Ktor send
a POST (the same offer, the head and the body written apart). The gateway serves HTTP/1.1
only, and RFC 9110 (7.8) lets it ignore the offer: each is answered as the request it
is, with its whole body. Before, uvicorn's httptools protocol ran each with an empty body
(curl's README request with `--http2`: a 400, "the multipart body ends before its closing boundary"; JSON: a 400, "the body is not valid JSON"), and a body
written after its head was parsed as a request of its own (a 400, the connection closed)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

from helpers.sockets import read_answer
from helpers.support import ServedApp

ROOT = Path(__file__).resolve().parents[2]
CAT = ROOT / "docs" / "assets" / "cat.jpg"
TEXT = {"text": "The striker scored twice in the final."}


def _curl(*arguments: str) -> tuple[int, dict[str, object], str]:
    curl = shutil.which("curl")
    assert curl, "curl is installed by make test (APT_TEST_PACKAGES)"
    done = subprocess.run(
        [curl, "--http2", "-sS", "-v", "-w", "\n%{http_code}", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    body, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(body), done.stderr


def test_curl_http2_over_http_is_answered_as_http_1_1_with_its_whole_body(gateway: ServedApp) -> None:
    status, answer, trace = _curl("-F", f"file=@{CAT}", f"{gateway.url}/classify")
    assert "> Upgrade: h2c" in trace  # the offer was made (with the upload's body)
    assert status == 200, answer
    labels = [prediction["label"] for prediction in answer["results"][0]["predictions"]]  # type: ignore[index]
    assert {"Egyptian cat", "tiger cat", "tabby, tabby cat"} & set(labels[:2]), labels
    status, answer, _ = _curl(
        "-H", "content-type: application/json", "-d", json.dumps(TEXT), f"{gateway.url}/classify"
    )
    assert status == 200, answer
    assert answer["model"] == "text_classifier"
    assert answer["results"][0]["predictions"], answer  # type: ignore[index]


def test_a_post_offering_h2c_with_its_body_written_after_its_head_keeps_its_connection(
    gateway: ServedApp,
) -> None:
    """As Ktor writes a POST: the head (with the h2c offer), then the body; then the next
    request on the same connection."""
    body = json.dumps(TEXT).encode()
    head = (
        f"POST /classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        f"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(head)
        sock.sendall(body)
        first = read_answer(sock)
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        second = read_answer(sock)
    assert first[0] == b"HTTP/1.1 200 OK", first
    assert json.loads(first[1])["results"][0]["predictions"]
    assert second[0] == b"HTTP/1.1 200 OK", second
