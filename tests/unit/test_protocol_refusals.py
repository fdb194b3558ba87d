"""The HTTP protocol's own refusals (gateway.http.protocol), in problem+json as every other:
a head is under a size no client can exceed (past ``max_head_bytes`` it is answered 431
before it ends, and what the client still sends is read away, never parsed; a head under the
cap is not counted with the body that follows it), and what httptools cannot parse is a 400.
An answer the client takes nothing of ends the connection at the send deadline, reset; every
connection ends at its age whatever it does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from gateway.http.protocol import HeaderTimeoutProtocol

from helpers.transport import RecordingTransport, connected

CAP = 4096
LINE = b"X-Filler: " + b"a" * 990 + b"\r\n"  # 1 KiB


async def _app(scope: object, receive: object, send: object) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]


class _Protocol(HeaderTimeoutProtocol):
    max_head_bytes = CAP
    send_seconds = 0.05
    linger_bytes = 1 << 20
    refused: ClassVar[list[str]] = []
    counted = staticmethod(refused.append)


Connection = tuple[_Protocol, RecordingTransport, asyncio.AbstractEventLoop]


class _Aging(_Protocol):
    max_age_seconds = 0.05
    age_grace_seconds = 0.05


def _connected(app: Any, kind: type[_Protocol] = _Protocol) -> Iterator[Connection]:
    _Protocol.refused.clear()
    yield from connected(kind, app)


@pytest.fixture
def connection() -> Iterator[Connection]:
    """A connection to an app that answers 204 without reading the body."""
    yield from _connected(_app)


def test_a_head_past_the_cap_is_a_431_and_what_follows_is_never_parsed(
    connection: Connection,
) -> None:
    protocol, transport, _ = connection
    protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
    for _ in range(CAP // len(LINE) + 2):  # (httptools hands a header over at the next one)
        protocol.data_received(LINE)
    [answer] = transport.written
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ")
    assert b"content-type: application/problem+json" in head
    assert b"connection: close" in head
    assert json.loads(body)["type"].endswith(":head-too-large")
    assert transport.eof  # lingering: the client reads its answer
    assert not transport.closed
    assert _Protocol.refused == ["head-too-large"]
    kept = len(protocol.headers)
    for _ in range(100):
        protocol.data_received(LINE)
    assert len(protocol.headers) == kept  # read away, not parsed
    assert transport.written == [answer]


@pytest.mark.parametrize("pieces", [1, 3], ids=["one-read", "three-reads"])
def test_one_header_value_past_the_cap_is_a_431(connection: Connection, pieces: int) -> None:
    """One field whose value alone is over the cap, the head ending in the same reads.
    Before, httptools hands a field over only once it ends, and the cap was checked after
    each read: a head whose last field ended in the read that ended the head was never
    counted, and served (a 50 MiB value on an anonymous socket: 200, the gateway +50 MiB)."""
    protocol, transport, _ = connection
    data = b"GET /livez HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * (CAP + 100) + b"\r\n\r\n"
    step = -(-len(data) // pieces)
    for start in range(0, len(data), step):
        protocol.data_received(data[start : start + step])
    [answer] = transport.written
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
    assert _Protocol.refused == ["head-too-large"]


def test_a_header_value_that_never_ends_is_a_431_once_past_the_cap(connection: Connection) -> None:
    """A value sent a KiB at a time and never ended: answered 431 as the head passes the
    cap, the rest never given to the parser. Before, httptools kept it growing, unseen,
    until the head's deadline."""
    protocol, transport, loop = connection
    protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\nX-A: ")
    for _ in range(CAP // 1024 + 1):
        protocol.data_received(b"a" * 1024)
    [answer] = transport.written
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
    assert transport.eof
    protocol.data_received(b"a" * 1024 + b"\r\n\r\n")  # read away, never parsed
    loop.run_until_complete(asyncio.sleep(0.01))
    assert transport.written == [answer]


def test_a_head_under_the_cap_is_served_whatever_body_comes_in_its_chunk(
    connection: Connection,
) -> None:
    protocol, transport, loop = connection
    head = b"POST /x HTTP/1.1\r\nHost: x\r\n" + LINE * 3 + b"Content-Length: 65536\r\n\r\n"
    assert len(head) < CAP
    protocol.data_received(head[:100])
    protocol.data_received(head[100:] + b"b" * 65536)  # the head's end and a body far over the cap
    loop.run_until_complete(asyncio.sleep(0.01))
    assert transport.written
    assert transport.written[0].startswith(b"HTTP/1.1 204 ")
    assert _Protocol.refused == []


def test_what_httptools_cannot_parse_is_a_400_in_problem_json(
    connection: Connection,
) -> None:
    """uvicorn answers it text/plain; every other refusal is problem+json."""
    protocol, transport, _ = connection
    protocol.data_received(b"GET /livez HTTP/1.1\r\nHost x\r\n\r\n")
    [answer] = transport.written
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"content-type: application/problem+json" in head
    assert json.loads(body)["type"].endswith(":malformed-request")
    assert transport.closed
    assert _Protocol.refused == ["malformed-request"]


def test_what_httptools_cannot_parse_after_a_request_answered_on_the_connection_is_a_400_too(
    connection: Connection,
) -> None:
    """A keep-alive connection whose next request is malformed (an unknown method, a bad
    header line): that request is answered 400 as on a fresh connection. Before, the
    previous request's answer, long complete, was taken for this one's: the connection
    closed with no answer (httpx: "Server disconnected without sending a response")."""
    protocol, transport, loop = connection
    protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
    loop.run_until_complete(asyncio.sleep(0.01))
    [first] = transport.written
    assert first.startswith(b"HTTP/1.1 204 ")
    assert not transport.closed
    protocol.data_received(b"FOO /livez HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = transport.written[-1]
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), transport.written
    assert json.loads(body)["type"].endswith(":malformed-request")
    assert transport.closed
    assert _Protocol.refused == ["malformed-request"]


def test_a_malformed_head_after_an_answered_request_on_a_fresh_connection_each(
    connection: Connection,
) -> None:
    """The same with a header line httptools refuses, on a connection of its own."""
    protocol, transport, loop = connection
    protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
    loop.run_until_complete(asyncio.sleep(0.01))
    protocol.data_received(b"GET /livez HTTP/1.1\r\nHost x\r\n\r\n")
    assert [answer[:13] for answer in transport.written] == [b"HTTP/1.1 204 ", b"HTTP/1.1 400 "]
    assert transport.closed


def test_a_malformed_request_pipelined_behind_one_under_way_is_answered_400_after_it(
    reading: Connection,
) -> None:
    """Behind a request whose answer is not written yet, a malformed one: the answer under
    way goes out whole, then the malformed request's 400, then the connection closes.
    Before, the 400 was written at once and the connection closed: the client read it as
    the first request's answer, which was lost."""
    protocol, transport, loop = reading
    protocol.data_received(
        b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab" + b"FOO / HTTP/1.1\r\n\r\n"
    )
    loop.run_until_complete(asyncio.sleep(0.05))
    wire = b"".join(transport.written)
    answer, refusal = wire.split(b"0\r\n\r\n", 1)  # (the first answer's body is chunked)
    assert answer.startswith(b"HTTP/1.1 200 "), wire
    assert b"connection: close" in answer
    assert answer.endswith(b"1\r\n2\r\n")  # its body, the length it read, whole
    assert refusal.startswith(b"HTTP/1.1 400 "), wire
    assert json.loads(refusal.partition(b"\r\n\r\n")[2])["type"].endswith(":malformed-request")
    assert transport.eof or transport.closed
    assert _Protocol.refused == ["malformed-request"]


def test_a_body_before_a_pipelined_head_in_one_chunk_is_not_counted_as_that_head(
    connection: Connection,
) -> None:
    """One chunk with the end of a request, a body over the cap, and the start of the next
    head: only the next head's own chunks count."""
    protocol, transport, loop = connection
    first = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n"
    protocol.data_received(first[:20])
    protocol.data_received(first[20:] + b"b" * 65536 + b"GET /y HTTP/1.1\r\nHost: x\r\n")
    protocol.data_received(LINE + b"\r\n")
    loop.run_until_complete(asyncio.sleep(0.01))
    assert _Protocol.refused == []
    assert transport.written
    assert all(answer.startswith(b"HTTP/1.1 204 ") for answer in transport.written)


def test_on_the_inference_protocols_door_the_431_is_in_its_error_form(
    connection: Connection,
) -> None:
    """What tritonclient reads on /v2: ``error``, application/json (the problem's members beside)."""
    protocol, transport, _ = connection
    protocol.data_received(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n")
    for _ in range(CAP // len(LINE) + 2):  # (httptools hands a header over at the next one)
        protocol.data_received(LINE)
    [answer] = transport.written
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ")
    assert b"content-type: application/json\r\n" in head
    assert "over 4096 bytes" in json.loads(body)["error"]


async def _reading_app(scope: object, receive: object, send: object) -> None:
    """Reads the whole body, answers 200 with its length."""
    size = 0
    while True:
        message = await receive()  # type: ignore[operator]
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": str(size).encode()})  # type: ignore[operator]


@pytest.fixture
def reading() -> Iterator[Connection]:
    """A connection to an app that reads the whole body first."""
    yield from _connected(_reading_app)


CHUNKED = b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunks(size: int, count: int) -> bytes:
    return (b"%x\r\n" % size + b"a" * size + b"\r\n") * count


def test_a_body_in_one_byte_chunks_is_a_400_and_the_rest_is_never_parsed(
    reading: Connection,
) -> None:
    """Each chunk costs the parser a step: 1-byte chunks cost ~100x the CPU of the same
    bytes in one piece. Past 64 chunks plus one per ``min_chunk_bytes``, the parser stops."""
    protocol, transport, loop = reading
    protocol.data_received(CHUNKED + _chunks(1, 1000))
    loop.run_until_complete(asyncio.sleep(0.01))
    [answer] = transport.written
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"content-type: application/problem+json" in head
    problem = json.loads(body)
    assert problem["type"].endswith(":malformed-request")
    assert "chunks" in problem["detail"]
    assert transport.eof  # lingering: the client reads its answer
    assert not transport.closed
    assert _Protocol.refused == ["malformed-request"]
    assert protocol._body_bytes <= 65  # the parser stopped at the 65th chunk
    protocol.data_received(_chunks(1, 1000))  # read away, not parsed
    assert protocol._body_bytes <= 65
    assert transport.written == [answer]


def test_chunked_bodies_in_chunks_a_client_sends_are_served(
    reading: Connection,
) -> None:
    """A small body in 60 tiny chunks (under the free 64), and 100 KiB in 1 KiB chunks
    followed by 60 small ones (64 plus one per KiB allows 164): both read whole."""
    protocol, transport, loop = reading
    protocol.data_received(CHUNKED + _chunks(3, 60) + b"0\r\n\r\n")
    loop.run_until_complete(asyncio.sleep(0.01))
    protocol.data_received(CHUNKED + _chunks(1024, 100) + _chunks(10, 60) + b"0\r\n\r\n")
    loop.run_until_complete(asyncio.sleep(0.01))
    answers = b"".join(transport.written)
    assert answers.count(b"HTTP/1.1 200 ") == 2, answers
    assert b"\r\n180\r\n" in answers  # (the answers' bodies go chunked)
    assert b"\r\n103000\r\n" in answers
    assert _Protocol.refused == []
    assert not transport.closed


def test_a_chunk_size_line_without_end_is_a_400_past_its_framing_and_never_parsed_further(
    reading: Connection,
) -> None:
    """httptools reads a chunk's extension (and a size's leading zeros) without bound, and
    none of it is body: 1 MiB of one extension, in the reads after the head, is refused
    once the framing passes a head's worth (the cap here, 4 KiB) plus 64 bytes a chunk.
    Before, all of it was read and the body's route waited on."""
    protocol, transport, loop = reading
    protocol.data_received(CHUNKED + b"2;name=")
    for _ in range(256):
        protocol.data_received(b"v" * 4096)
    loop.run_until_complete(asyncio.sleep(0.01))
    [answer] = transport.written
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert "framing" in json.loads(body)["detail"]
    assert _Protocol.refused == ["malformed-request"]
    assert transport.eof  # lingering: the client reads its answer
    assert not transport.closed
    # refused at the read that passed it: what followed was read away, never parsed
    assert protocol._body_wire <= CAP + 4096


def test_a_chunk_sizes_leading_zeros_count_as_framing(reading: Connection) -> None:
    """A size line of 8 KiB of zeros, in reads of 1 KiB, is past the framing a chunk may
    take. (What one read holds whole, the head's end with a body, is bounded by the read's
    size and not counted.)"""
    protocol, transport, loop = reading
    protocol.data_received(CHUNKED)
    for _ in range(8):
        protocol.data_received(b"0" * 1024)
    protocol.data_received(b"2\r\n{}\r\n0\r\n\r\n")
    loop.run_until_complete(asyncio.sleep(0.01))
    [refused] = transport.written
    assert refused.startswith(b"HTTP/1.1 400 ")


def test_chunks_with_an_extension_each_and_a_trailer_are_served(reading: Connection) -> None:
    """100 KiB of 1 KiB chunks with a short extension each (``;a=b``) and a trailer: their
    framing is well within 64 bytes a chunk and a head's worth."""
    protocol, transport, loop = reading
    protocol.data_received(CHUNKED)
    protocol.data_received((b"400;a=b\r\n" + b"a" * 1024 + b"\r\n") * 100)
    protocol.data_received(b"0\r\nX-Checksum: 1234\r\n\r\n")
    loop.run_until_complete(asyncio.sleep(0.01))
    [answer] = transport.written
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert b"\r\n102400\r\n" in answer
    assert _Protocol.refused == []


def test_a_body_answered_before_it_was_read_closes_lingering_on_too_many_chunks_with_no_second_answer(
    connection: Connection,
) -> None:
    """Answered before its body (a 401, a 404): what comes after is read away, and past the
    chunks it may have the parser stops and the connection closes lingering (its write side
    shut, what follows read away): no answer follows the one given, and no reset takes the
    given one from a client still sending (closed at once, the socket was reset and an
    attack test's client lost its 401 now and then)."""
    protocol, transport, loop = connection
    protocol.data_received(CHUNKED)
    loop.run_until_complete(asyncio.sleep(0.01))
    [answer] = transport.written
    assert answer.startswith(b"HTTP/1.1 204 ")
    protocol.data_received(_chunks(1, 1000))
    assert transport.eof
    assert not transport.closed
    assert protocol._body_bytes <= 65  # the parser stopped at the 65th chunk
    protocol.data_received(_chunks(1, 1000))  # read away, not parsed
    assert protocol._body_bytes <= 65
    assert transport.written == [answer]


def test_an_answer_written_in_the_turn_the_chunks_run_out_is_sent_not_dropped() -> None:
    """The route writes its 401 and, in the same turn of the loop, the body's next bytes
    run past the chunks it may have: the 401 (still in this turn's write) goes out, then
    the connection closes lingering. Before, the connection closed at once and the 401
    was never written: an attack test's client read b'' (CI on 0b617ef)."""
    connections: list[Any] = []

    async def answer_then_chunks(scope: object, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 401, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"no key"})  # type: ignore[operator]
        connections[0].data_received(_chunks(1, 1000))  # arriving before this turn's write

    for protocol, transport, loop in _connected(answer_then_chunks):
        connections.append(protocol)
        protocol.data_received(CHUNKED)
        loop.run_until_complete(asyncio.sleep(0.01))
        answers = b"".join(transport.written)
        assert answers.startswith(b"HTTP/1.1 401 "), answers
        assert answers.count(b"HTTP/1.1 ") == 1
        assert transport.eof
        assert not transport.closed


def test_a_refusal_the_protocol_makes_never_overtakes_the_answer_written_before_it() -> None:
    """A route's answer written in the same turn of the loop as the next pipelined head
    runs past its cap: the 431 goes out after that answer, not ahead of it (written
    straight to the socket, it overtook the answer still waiting in this turn's write)."""
    connections: list[Any] = []

    async def answer_then_a_long_head(scope: object, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]
        connections[0].data_received(b"GET /next HTTP/1.1\r\nHost: x\r\n" + LINE * 8)

    for protocol, transport, loop in _connected(answer_then_a_long_head):
        connections.append(protocol)
        protocol.data_received(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        loop.run_until_complete(asyncio.sleep(0.01))
        answers = b"".join(transport.written)
        assert answers.startswith(b"HTTP/1.1 204 "), answers[:100]
        assert answers.count(b"HTTP/1.1 431 ") == 1


def test_an_answer_still_being_sent_when_the_chunks_run_out_goes_out_whole_then_lingers() -> None:
    """The chunks run out while the route is still answering (its answer started, not
    ended): the answer goes out whole, then the connection closes lingering."""
    release = asyncio.Event()

    async def slow_answer(scope: object, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"part", "more_body": True})  # type: ignore[operator]
        await release.wait()
        await send({"type": "http.response.body", "body": b"end"})  # type: ignore[operator]

    for protocol, transport, loop in _connected(slow_answer):
        protocol.data_received(CHUNKED)
        loop.run_until_complete(asyncio.sleep(0.01))
        protocol.data_received(_chunks(1, 1000))
        assert not transport.eof  # the answer is not done
        assert not transport.closed
        loop.call_soon(release.set)
        loop.run_until_complete(asyncio.sleep(0.01))
        answers = b"".join(transport.written)
        assert answers.startswith(b"HTTP/1.1 200 ")
        assert answers.count(b"HTTP/1.1 ") == 1
        assert b"part" in answers
        assert b"end" in answers
        assert transport.eof
        assert not transport.closed
        assert protocol._body_bytes <= 65


def test_a_pipeline_past_its_bound_is_answered_up_to_it_and_closed(
    connection: Connection,
) -> None:
    """100 requests pipelined in one piece: the one answered and the 16 waiting behind it
    get their answers, the last with Connection: close, then the connection closes; the
    rest are never parsed (before, uvicorn queued every one: 50 sockets of 256 KiB each,
    reading nothing, took the gateway from 108 to 1,028 MiB)."""
    protocol, transport, loop = connection
    protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n" * 100)
    assert len(protocol.pipeline) == 16
    loop.run_until_complete(asyncio.sleep(0.05))
    answers = b"".join(transport.written)
    assert answers.count(b"HTTP/1.1 204 ") == 17, answers.count(b"HTTP/1.1 ")
    assert answers.count(b"connection: close") == 1
    assert answers.rindex(b"connection: close") > answers.rindex(b"HTTP/1.1 204 ")  # on the last
    assert transport.eof  # lingering: what the client sent after is read away, its answers read
    assert not transport.closed
    assert _Protocol.refused == ["pipeline-full"]
    protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n" * 10)  # read away
    loop.run_until_complete(asyncio.sleep(0.01))
    assert b"".join(transport.written) == answers


def test_a_pipeline_within_its_bound_is_answered_and_kept(
    connection: Connection,
) -> None:
    protocol, transport, loop = connection
    protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n" * 17)
    loop.run_until_complete(asyncio.sleep(0.05))
    answers = b"".join(transport.written)
    assert answers.count(b"HTTP/1.1 204 ") == 17
    assert b"connection: close" not in answers
    assert not transport.closed
    assert not transport.eof
    assert _Protocol.refused == []


def test_a_head_of_too_many_fields_is_a_431_and_what_follows_is_never_parsed(
    connection: Connection,
) -> None:
    """Under the size cap, 1,000 fields of 5 bytes: each costs every layer reading the
    headers a step (12,000 cost the gateway 10 ms a request against 1 ms)."""
    protocol, transport, _ = connection
    protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n" + b"a:b\r\n" * 1000)
    [answer] = transport.written
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ")
    assert b"content-type: application/problem+json" in head
    assert "more than 100 header fields" in json.loads(body)["detail"]
    assert transport.eof  # lingering: the client reads its answer
    assert _Protocol.refused == ["head-too-large"]
    assert len(protocol.headers) == 100
    protocol.data_received(b"a:b\r\n" * 1000 + b"\r\n")
    assert len(protocol.headers) == 100  # read away, not parsed
    assert transport.written == [answer]


def test_a_head_of_a_hundred_fields_is_served(
    connection: Connection,
) -> None:
    protocol, transport, loop = connection
    protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n" + b"a:b\r\n" * 99 + b"\r\n")
    loop.run_until_complete(asyncio.sleep(0.01))
    assert transport.written[0].startswith(b"HTTP/1.1 204 ")


def test_an_answer_the_client_takes_nothing_of_ends_the_connection_at_the_send_deadline(
    connection: Connection,
) -> None:
    protocol, transport, loop = connection
    protocol.pause_writing()  # the transport's buffer over its high-water mark
    loop.run_until_complete(asyncio.sleep(0.02))
    assert not transport.closed
    loop.run_until_complete(asyncio.sleep(0.06))
    # reset: closing would wait for bytes that never go, and aborting alone leaves the
    # kernel offering what it holds of the answer
    assert transport.reset


def test_a_client_that_takes_its_answer_in_time_keeps_the_connection(connection: Connection) -> None:
    protocol, transport, loop = connection
    for _ in range(3):  # each stall shorter than the deadline, together longer
        protocol.pause_writing()
        loop.run_until_complete(asyncio.sleep(0.03))
        protocol.resume_writing()
    loop.run_until_complete(asyncio.sleep(0.06))
    assert not transport.closed


def test_an_idle_connection_closes_at_its_age() -> None:
    for protocol, transport, loop in _connected(_app, _Aging):
        protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        loop.run_until_complete(asyncio.sleep(0.02))
        assert transport.written[0].startswith(b"HTTP/1.1 204 ")
        assert not transport.closed
        loop.run_until_complete(asyncio.sleep(0.05))
        assert transport.closed
        assert not transport.aborted


def _answer_when(release: asyncio.Event) -> Any:
    async def app(scope: object, receive: object, send: Any) -> None:
        await release.wait()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


def test_a_request_under_way_at_the_age_is_answered_then_the_connection_closes() -> None:
    release = asyncio.Event()
    for protocol, transport, loop in _connected(_answer_when(release), _Aging):
        protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        loop.run_until_complete(asyncio.sleep(0.06))  # past the age, within its grace
        assert not transport.closed
        release.set()
        loop.run_until_complete(asyncio.sleep(0.01))
        [answer] = transport.written
        assert answer.startswith(b"HTTP/1.1 204 ")
        assert b"connection: close" in answer.lower()
        assert transport.closed
        assert not transport.aborted


def test_a_head_arriving_past_the_age_is_the_last_answered() -> None:
    release = asyncio.Event()
    release.set()
    for protocol, transport, loop in _connected(_answer_when(release), _Aging):
        protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n")  # a head under way
        loop.run_until_complete(asyncio.sleep(0.06))
        assert not transport.closed
        protocol.data_received(b"\r\n")
        loop.run_until_complete(asyncio.sleep(0.01))
        [answer] = transport.written
        assert b"connection: close" in answer.lower()
        assert transport.closed


def test_an_answer_unfinished_at_the_end_of_the_grace_is_cut() -> None:
    never = asyncio.Event()
    for protocol, transport, loop in _connected(_answer_when(never), _Aging):
        protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        loop.run_until_complete(asyncio.sleep(0.08))
        assert not transport.closed  # within the grace
        loop.run_until_complete(asyncio.sleep(0.04))
        assert transport.reset


def test_requests_pipelined_before_the_age_are_all_answered_the_last_closing() -> None:
    release = asyncio.Event()
    for protocol, transport, loop in _connected(_answer_when(release), _Aging):
        protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        loop.run_until_complete(asyncio.sleep(0.06))  # past the age, within its grace
        release.set()
        loop.run_until_complete(asyncio.sleep(0.02))
        answers = b"".join(transport.written).split(b"HTTP/1.1 204 ")[1:]
        assert len(answers) == 3
        assert [b"connection: close" in answer.lower() for answer in answers] == [False, False, True]
        assert transport.closed
        assert not transport.aborted


def test_requests_pipelined_behind_one_under_way_are_answered_while_the_last_body_arrives(
    reading: Connection,
) -> None:
    """Two requests, then the head of a third and the start of its body, in one chunk; the
    rest of its body later. Every request is answered, in order, and the connection kept.
    Before, the first answer, complete while the third body was still arriving, was taken
    for an answer given before its own body was read: the pipeline never went on, the two
    behind it were never answered, and the connection closed at the keep-alive timeout
    (found by a fuzzer of pipelined sequences with random send splits)."""
    protocol, transport, loop = reading
    third = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    protocol.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n" * 2 + third + b"a" * 10)
    loop.run_until_complete(asyncio.sleep(0.02))
    protocol.data_received(b"a" * 90)
    loop.run_until_complete(asyncio.sleep(0.02))
    wire = b"".join(transport.written)
    assert wire.count(b"HTTP/1.1 200 ") == 3, wire
    assert wire.endswith(b"3\r\n100\r\n0\r\n\r\n"), wire  # the third, its whole body read
    assert not transport.closed


@pytest.mark.parametrize("fields", [False, True], ids=["one-value", "fields"])
def test_a_head_past_the_cap_pipelined_behind_a_request_under_way_is_answered_431_after_it(
    fields: bool,
) -> None:
    """A request whose answer is not written yet, then a head over the cap: the answer goes
    out whole, then the 431, then the connection closes. Before, the connection closed at
    once and the request before lost its answer (found by the pipelining fuzzer)."""
    release = asyncio.Event()
    for protocol, transport, loop in _connected(_answer_when(release)):
        protocol.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
        protocol.data_received(b"GET /b HTTP/1.1\r\nHost: x\r\n")
        filler = LINE * (CAP // len(LINE) + 2) if fields else b"X-A: " + b"a" * CAP
        protocol.data_received(filler)
        protocol.data_received(b"\r\n")
        assert not transport.written
        assert not transport.closed
        release.set()
        loop.run_until_complete(asyncio.sleep(0.02))
        wire = b"".join(transport.written)
        assert wire.count(b"HTTP/1.1 204 ") == 2, wire
        assert wire.rindex(b"HTTP/1.1 204 ") < wire.index(b"HTTP/1.1 431 "), wire
        assert transport.eof or transport.closed
        assert _Protocol.refused == ["head-too-large"]


@pytest.mark.parametrize("body", ["one-byte-chunks", "endless-extension"])
def test_a_body_past_its_bound_pipelined_behind_a_request_under_way_is_answered_400_after_it(
    body: str,
) -> None:
    """A request whose answer is not written yet, then a chunked body past its bound (too
    many chunks, or framing without end): the answer goes out whole, then the 400, then the
    connection closes; the refused request never runs. Before, the 400 was written at once,
    ahead of the answer under way, which was lost (found by the pipelining fuzzer)."""
    release = asyncio.Event()
    for protocol, transport, loop in _connected(_answer_when(release)):
        protocol.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        protocol.data_received(CHUNKED)
        if body == "one-byte-chunks":
            protocol.data_received(_chunks(1, 200))
        else:
            protocol.data_received(b"2;n=" + b"v" * (CAP + 100))
        assert not transport.written
        release.set()
        loop.run_until_complete(asyncio.sleep(0.02))
        wire = b"".join(transport.written)
        assert wire.startswith(b"HTTP/1.1 204 "), wire
        assert wire.count(b"HTTP/1.1 ") == 2, wire
        assert b"HTTP/1.1 400 " in wire, wire
        assert transport.eof or transport.closed
