"""A request that offers to upgrade the connection (``Connection: Upgrade`` with
``Upgrade: h2c``, as curl's ``--http2`` sends over http://, Java's RestClient and Ktor by
default; or ``Upgrade: websocket``) is served as the HTTP/1.1 request it also is: the
gateway switches to no other protocol, and RFC 9110 (7.8) lets a server ignore the offer.

httptools stops at such a head as if the rest were another protocol: uvicorn answered
the request with an empty body (a 400 for any JSON) and parsed what followed as a new
request (a 400, and the connection closed), and wrote two warnings for every such
request, whoever sent it (Kludex/uvicorn#2722, MagicStack/httptools#124)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from gateway.http.protocol import HeaderTimeoutProtocol

from helpers.transport import RecordingTransport, connected

H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
BODY = b'{"texts": ["the film was a delight from start to finish"]}'


async def _echo(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    """Reads the whole body, answers 200 with it."""
    body = b""
    while True:
        message = await receive()  # type: ignore[operator]
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    answer = b"%s %s %d:%s" % (scope["method"].encode(), scope["path"].encode(), len(body), body)
    headers = [(b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": answer})  # type: ignore[operator]


class _Protocol(HeaderTimeoutProtocol):
    linger_bytes = 1 << 20


Connection = tuple[_Protocol, RecordingTransport, asyncio.AbstractEventLoop]


@pytest.fixture
def connection() -> Iterator[Connection]:
    yield from connected(_Protocol, _echo)


def _send(connection: Connection, *reads: bytes) -> list[bytes]:
    """Each read in turn (the loop run between them); the answers written, split."""
    protocol, transport, loop = connection
    for data in reads:
        protocol.data_received(data)
        loop.run_until_complete(asyncio.sleep(0.01))
    wire = b"".join(transport.written)
    return [b"HTTP/1.1" + answer for answer in wire.split(b"HTTP/1.1")[1:]]


def _post(body: bytes, framing: str = "length") -> bytes:
    length = f"Content-Length: {len(body)}" if framing == "length" else "Transfer-Encoding: chunked"
    return b"POST /classify HTTP/1.1\r\nHost: x\r\n%s\r\n%s\r\n" % (length.encode(), H2C)


def _chunked(body: bytes, size: int = 16) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("cut", ["with-the-head", "after-the-head", "in-three-reads"])
def test_an_upgrade_offer_with_a_body_is_served_its_whole_body(
    connection: Connection, framing: str, cut: str
) -> None:
    """Before: answered at once with an empty body; the body, when it came in a read of
    its own (Ktor writes the head and the body apart), parsed as a new request: a 400."""
    head = _post(BODY, framing)
    body = BODY if framing == "length" else _chunked(BODY)
    reads = {
        "with-the-head": [head + body],
        "after-the-head": [head, body],
        "in-three-reads": [head + body[:7], body[7:20], body[20:]],
    }[cut]
    answers = _send(connection, *reads)
    assert len(answers) == 1, answers
    assert answers[0].startswith(b"HTTP/1.1 200 "), answers
    assert answers[0].endswith(b"POST /classify %d:%s" % (len(BODY), BODY))
    assert not connection[1].closed


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_the_connection_serves_the_next_request_after_an_upgrade_offer(
    connection: Connection, framing: str
) -> None:
    """curl sends its next request on the same connection when the offer is not taken
    (before: for a request with a body, that one's 400, and the connection closed)."""
    body = BODY if framing == "length" else _chunked(BODY)
    answers = _send(connection, _post(BODY, framing), body, b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
    assert [answer[:13] for answer in answers] == [b"HTTP/1.1 200 "] * 2, answers
    assert answers[0].endswith(b"POST /classify %d:%s" % (len(BODY), BODY))
    assert answers[1].endswith(b"GET /livez 0:")
    assert not connection[1].closed


def test_a_request_pipelined_right_behind_an_upgrade_offers_body_is_answered_after_it(
    connection: Connection,
) -> None:
    second = b"POST /models/m/classify HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    answers = _send(connection, _post(BODY) + BODY + second)
    assert len(answers) == 2, answers
    assert answers[0].endswith(b"POST /classify %d:%s" % (len(BODY), BODY))
    assert answers[1].endswith(b"POST /models/m/classify 2:{}")
    assert not connection[1].closed


@pytest.mark.parametrize("upgrade", [b"websocket", b"h2c", b"TLS/1.2"])
def test_an_upgrade_offer_is_answered_as_http_and_logs_nothing(
    connection: Connection, upgrade: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Two warnings a request, from anyone, before ("Unsupported upgrade request." and
    "No supported WebSocket library detected")."""
    caplog.set_level(logging.DEBUG)
    head = b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: %s\r\n\r\n" % upgrade
    answers = _send(connection, head, head)
    assert [answer[:13] for answer in answers] == [b"HTTP/1.1 200 "] * 2, answers
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_the_chunk_bound_holds_for_an_upgrade_offers_body(connection: Connection) -> None:
    """1-byte chunks past 64 are refused (gateway.http.protocol) here as on any request."""
    protocol = connection[0]
    answers = _send(connection, _post(b"", "chunked") + b"1\r\na\r\n" * 1000)
    assert len(answers) == 1, answers
    assert answers[0].startswith(b"HTTP/1.1 400 "), answers
    assert b"chunks" in answers[0]
    assert protocol._body_bytes <= 65


def test_an_upgrade_offer_whose_transfer_encoding_does_not_end_chunked_is_a_400(
    connection: Connection,
) -> None:
    """As httptools refuses it in any other request (RFC 9112, 6.3): the body's length
    cannot be known, and what follows it, read as a request of its own, would be smuggled
    past a proxy that framed it otherwise. Before, an offer skipped the check: the bytes
    after its head were served as the next request."""
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    head = b"POST /classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n%s\r\n" % H2C
    answers = _send(connection, head + smuggled)
    assert len(answers) == 1, answers
    assert answers[0].startswith(b"HTTP/1.1 400 "), answers
    assert b"Transfer-Encoding must end with chunked" in answers[0]
    assert b"/smuggled" not in answers[0]
    assert connection[1].eof or connection[1].closed
