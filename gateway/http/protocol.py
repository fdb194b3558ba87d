"""uvicorn's HTTP protocol as the gateway runs it: the one module that touches uvicorn's
private protocol internals (``HttpToolsProtocol`` and its request cycle), each attribute it
uses held by tests/unit/test_uvicorn_contract.py, and uvicorn bounded above in
pyproject.toml so an upgrade is a decision.

Every connection is under one deadline no byte from the client can extend (head, drain,
keep-alive, send, linger: :class:`HeaderTimeoutProtocol`), a head is under a size no client can
exceed, and a request refused from its head (gateway.http.headshed) is answered without its
body being read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import urllib.parse
import weakref
from collections.abc import Callable
from time import perf_counter
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from gateway import jsoncodec
from gateway.errors import GatewayError, HeadTooLargeError, MalformedRequestError, TooManyConnectionsError
from gateway.http.addresses import AddressConnections
from gateway.http.bodies import BODY_ARRIVED, BodyArrival
from gateway.http.headshed import HeadRefusal, HeadShed
from gateway.http.problems import in_door_form

logger = logging.getLogger("gateway.server")


# chunks any chunked body may have whatever their size (a client streaming small pieces
# of a small body, a trailer's worth)
FREE_CHUNKS = 64
# what a chunked body's framing (size lines, their extensions and leading zeros, the CRLFs)
# may take on the wire per chunk beyond the chunk's data; and, once for the body, a head's
# worth (``max_head_bytes``) for its trailers. A size line is a few hex digits: 64 bytes is
# ten times what a client's framing takes.
FRAMING_PER_CHUNK = 64

# SO_LINGER on, for 0 s: closing the socket resets it, what the kernel still holds dropped
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


class _ParserStoppedError(Exception):
    """Raised from a parser callback: httptools stops and reports HttpParserCallbackError."""


# the rejection counted when a connection's pipeline is full (no answer carries it)
PIPELINE_FULL = "pipeline-full"


class _LingerOnClose:
    """A connection's transport as uvicorn sees it: closing it lingers while the request's
    body is still on its way (:meth:`HeaderTimeoutProtocol.close_lingering`), and what is
    written in one turn of the event loop goes out in one write: uvicorn writes an
    answer's head and its body apart, two system calls and two TCP segments. (Measured
    on a refusal flood: 0.310 ms of gateway CPU a refusal with it, 0.301 without, so the
    saving is below this machine's noise; the segments it saves are the client's.)"""

    def __init__(self, transport: asyncio.Transport, protocol: HeaderTimeoutProtocol) -> None:
        self._transport = transport
        # weakly: the protocol holds this wrapper, and a strong reference back would make
        # every connection a reference cycle, freed only when the collector walks it
        self._protocol = weakref.ref(protocol)
        self._pending: list[bytes] = []
        self._loop = protocol.loop
        # what uvicorn calls on every request, bound here rather than found by __getattr__
        self.get_extra_info = transport.get_extra_info
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        """Write what this turn of the loop wrote (before the transport closes or shuts
        its write side, too)."""
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        protocol = self._protocol()
        if protocol is None:  # (the connection is gone, and its protocol with it)
            self._transport.close()
        else:
            protocol.close_lingering()

    def is_closing(self) -> bool:
        protocol = self._protocol()
        return (protocol is not None and protocol.lingering) or self._transport.is_closing()


def _skipped_framing(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The head that tells httptools how an upgrade offer's body is framed (its
    Transfer-Encoding or Content-Length), or None when it has none; a Transfer-Encoding
    that does not end with chunked is refused. httptools took the offer for a protocol
    switch and skipped the body: fed this head and then what follows, it reads the body as
    any other (:meth:`HeaderTimeoutProtocol._parse`)."""
    length: bytes | None = None
    coding: bytes | None = None  # the last transfer coding (its fields read as one list)
    for name, value in headers:  # (names lowercased by uvicorn; httptools refused two lengths)
        if name == b"transfer-encoding":
            coding = value.rsplit(b",", 1)[-1].strip().lower()
        elif name == b"content-length":
            length = value.strip()
    if coding == b"chunked":
        return b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
    if coding is not None:
        # what httptools refuses in any other request (RFC 9112, 6.3): its body's length
        # cannot be known, and what follows it, read as a request, would be smuggled
        raise MalformedRequestError("a request's Transfer-Encoding must end with chunked")
    size = int(length) if length is not None and length.isdigit() else 0
    return b"POST / HTTP/1.1\r\ncontent-length: %d\r\n\r\n" % size if size else None


class _NoEvent:
    def set(self) -> None:
        return None


class _RefusedCycle:
    """What uvicorn's callbacks see of a request refused from its head
    (gateway.http.headshed) until its answer is written: an answer under way (a pipelined
    next request waits for it), a body read away as it comes, and whether all of it came."""

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.response_complete = False
        self.more_body = True
        self.disconnected = False
        self.message_event = _NoEvent()


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with every connection under a deadline no byte from
    the client can extend or cancel (uvicorn's keep-alive timer is cancelled by any byte
    that arrives, and nothing re-arms it while a body is unread):

    - **head**: armed when the connection opens and when any byte arrives between
      requests (the parser's message-begin callback, or bytes that begin no message),
      disarmed once the head is complete;
    - **body**: the route reads it under ``server.body_timeout_seconds``
      (gateway.http.bodies);
    - **drain**: an answer given while the request's body is still on its way (401, 404,
      a refusal from the head) leaves the rest of the body to be read away for at most
      ``linger_seconds`` and ``linger_bytes``, counted from the answer: the connection is
      kept if the body ends in time (then keep-alive), closed otherwise;
    - **keep-alive**: uvicorn's, between requests;
    - **send**: while the client takes nothing of an answer (the socket's send buffer and
      the transport's above its high-water mark, writing paused), for at most
      ``send_seconds`` at a time: past it the connection is aborted, what was unsent
      dropped. Before, nothing bounded an answer's writing: anonymous sockets asking for
      the docs' 1.6 MB script 16 times each and reading nothing stayed open for good (15
      of 15 on a 16-connection door past the deadline; 9 still held after 65 s by hand);
    - **age**: every connection, whatever it does, at ``max_age_seconds``: idle, it
      closes then; with a request under way, that request's answer says ``Connection:
      close`` and the connection closes after it, and ``age_grace_seconds`` later it is
      cut whatever is left (what was unsent dropped), as the gRPC door's
      ``grpc.max_connection_age_seconds``. The send deadline alone is moved by every byte
      the client takes: one socket keeping three of the docs' 1.6 MB answers asked for and
      taking them at a few MB/s was still taking them 12 s on with the send deadline at
      2 s, and would have for good;
    - **linger**: below.

    A head over ``max_head_bytes`` is answered 431 as soon as it passes the size, and the
    connection closes lingering (below): httptools keeps every header and the URL it
    parses, so 300 MiB of headers on one anonymous socket took the gateway from 111 to
    477 MiB, and kept it there after the socket closed. Its bytes are counted as they
    arrive, before the parser sees them (httptools hands a field over only once it ends: one
    value never ended grew unseen until the head's deadline), and again as it ends (a 50 MiB
    value ended in the read that ended the head was served).

    A head of more than ``max_headers`` fields is answered 431 too, and the connection
    closed: 12,000 fields of 5 bytes (60 KB, under the size) cost the gateway 10 ms of CPU
    a request against 1 ms.

    A chunked body may come in at most :data:`FREE_CHUNKS` chunks plus one for every
    ``min_chunk_bytes`` of it: past that it is answered 400 and the connection closed, the
    rest never parsed. Each chunk costs the parser a step of its own: one anonymous socket
    sending 1-byte chunks after its 401 took 2.2 s of the gateway's CPU for 49 MB, against
    0.02 s for 53 MB sent in one piece. Its framing (size lines, with their extensions and
    leading zeros, which httptools reads without bound) may take at most
    :data:`FRAMING_PER_CHUNK` bytes a chunk and ``max_head_bytes`` for its trailers beyond
    its data, counted from the first read after its head: past that, the same 400. Before,
    a keyed client sent 512 MiB as one chunk's extension in 0.6 s, all of it read, none of
    it body, so no body limit saw it, and the connection stayed open.

    At most ``max_pipelined`` requests wait behind the one being answered on a connection:
    the next head stops the parser, the last one waiting is answered with ``Connection:
    close`` and the connection closes after it, what followed never parsed (a client
    resends it on a new connection, as HTTP/1.1 allows). httptools parses all it is given,
    and uvicorn queued every request in it: 50 anonymous sockets each sending 256 KiB of
    pipelined ``GET /livez`` and reading nothing took the gateway from 108 to 1,028 MiB.

    A request refused before its body was read (503 from its headers, 413 from its
    length) is answered with ``Connection: close``. Closed at once, the socket would be
    reset under a client still sending, whose next write fails before it reads the answer
    (64 of 100 clients uploading 7 MiB never read their 503). So, as nginx's lingering
    close: the answer goes out, the write side is shut (FIN), and what the client still
    sends is read and thrown away until it stops (its FIN), for at most
    ``linger_seconds`` and ``linger_bytes``; then the socket closes.
    """

    header_timeout: float = 10.0
    linger_seconds: float = 10.0
    send_seconds: float = 30.0
    max_age_seconds: float = 1800.0
    age_grace_seconds: float = 30.0
    linger_bytes: int = 64 * 1024 * 1024
    max_head_bytes: int = 64 * 1024
    min_chunk_bytes: int = 1024
    max_pipelined: int = 16
    max_headers: int = 100
    head_shed: HeadShed | None = None  # refuses from the head what the route would
    addresses: AddressConnections | None = None  # the door's connections by client address
    counted: Callable[[str], None] = staticmethod(lambda slug: None)  # a refusal made here, by problem type

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None  # armed while writing is paused
        # the connection's age: closes it when idle, or after the answer under way (then cut
        # at the grace's end); armed once the connection is taken (a refused one needs none)
        self._age_timer: asyncio.TimerHandle | None = None
        self.aged = False
        self._raw = transport
        self.lingering = False
        self._discarded = 0
        self._linger_timer: asyncio.TimerHandle | None = None
        # the request's body has all arrived (uvicorn's cycle stops saying once answered)
        self._body_done = True
        self._arrival = BodyArrival()  # the request's, in its scope (BODY_ARRIVED)
        self._drain_timer: asyncio.TimerHandle | None = None
        # the head being parsed: its target's and headers' bytes as httptools hands them
        # over (-1: no head is being parsed)
        self._head_bytes = -1
        # the head's bytes in the reads after the one it began in, and its last 3 bytes (its
        # end, CRLF CRLF, may come across two reads)
        self._head_wire = 0
        self._head_tail = b""
        # the message's chunks (chunked encoding) and body bytes so far, and the bytes read
        # while its body was being parsed (framing included)
        self._chunks = 0
        self._body_bytes = 0
        self._body_wire = 0
        self._messages = 0  # messages begun on the connection
        self._fields = 0  # the head's header fields (and a chunked body's trailers)
        self._refusal: GatewayError | None = None  # why the parser was stopped (a 400)
        self._after_answer: bytes | None = None  # a 400 written once the answer under way is
        # the request before the newest (the one a pipelined request is answered after)
        self._previous_cycle: RequestResponseCycle | _RefusedCycle | None = None
        # the pipeline is full: the parser was stopped for good, what arrives is read away
        self._parser_stopped = False
        # an upgrade offer's body, which httptools skipped: the head that frames it, fed to
        # the parser once it has stopped at the offer; and while that head is parsed, its
        # callbacks are muted (it is no request)
        self._offer_body: bytes | None = None
        self._replaying = False
        self._wrapped = _LingerOnClose(transport, self)
        super().connection_made(self._wrapped)  # type: ignore[arg-type]
        self._address: str | None = None
        addresses = self.addresses
        if addresses is not None:
            address = addresses.key(transport.get_extra_info("peername"))
            if address is not None:
                if not addresses.take(address):
                    self._too_many(addresses.limit)
                    return
                self._address = address
        self._age_timer = self.loop.call_later(self.max_age_seconds, self._aged)
        self._arm()

    def _too_many(self, limit: int) -> None:
        """Past its address's bound: answered 429 at once, before any request (the client
        reads it as its first request's answer), and closed. Waiting for a head would hold
        the door's slot as long as the head's deadline."""
        self.counted(TooManyConnectionsError.slug)
        error = TooManyConnectionsError(
            f"your address holds {limit} of the gateway's connections already", retry_after=1
        )
        self._raw.write(self._problem(error))
        self._raw.close()

    def close_lingering(self) -> None:
        self._wrapped.flush()  # the answer first
        raw, cycle = self._raw, self.cycle
        refusal, self._after_answer = self._after_answer, None
        if refusal is not None and not raw.is_closing() and (cycle is None or cycle.response_complete):
            raw.write(refusal)  # a malformed request's 400, behind the answer before it
        if self.lingering or raw.is_closing():
            return
        if (cycle is None or not cycle.more_body or cycle.disconnected) and not self._parser_stopped:
            raw.close()  # nothing more is coming
            return
        # (a stopped parser left what followed unread: closed now, the socket would be reset
        # under the answers the client has not read yet)
        self.lingering = True
        if raw.can_write_eof():
            raw.write_eof()  # once the answer is out
        raw.resume_reading()
        self._linger_timer = self.loop.call_later(self.linger_seconds, raw.close)

    def data_received(self, data: bytes) -> None:
        if self.lingering or self._parser_stopped or self._drain_timer is not None:
            self._discarded += len(data)
            if self._discarded > self.linger_bytes:
                self._raw.close()
                return
            if self.lingering or self._parser_stopped:
                return
        elif self._body_done and (self.cycle is None or self.cycle.response_complete):
            # between requests: uvicorn cancels its keep-alive timer on any byte, so the
            # head's deadline starts with the first (bytes that begin no message included)
            self._arm()
        message, in_body = self._messages, self._head_bytes == -1 and not self._body_done
        head_open = self._head_bytes >= 0
        if head_open:
            # a head under way: its part of this read (up to its end) is counted before the
            # parser sees it, which keeps a field's value whole until the field ends
            seen = self._head_tail + data
            end = seen.find(b"\r\n\r\n")
            part = len(data) if end < 0 else end + 4 - len(self._head_tail)
            if self._head_wire + part > self.max_head_bytes:
                self._head_too_large()
                return
        self._parse(data)
        if self._head_bytes > self.max_head_bytes:  # (checked once the chunk is parsed)
            self._head_too_large()
        elif self._head_bytes >= 0:  # a head unfinished at the read's end
            if head_open and message == self._messages:
                self._head_wire += len(data)
            else:  # begun in this read: as much of it as the parser handed over
                self._head_wire = self._head_bytes
            self._head_tail = (self._head_tail + data[-3:])[-3:]
        elif in_body and message == self._messages and not self._body_done:
            # all of it this body's: its data, and the framing around it
            self._body_wire += len(data)
            framing = self._body_wire - self._body_bytes
            if framing > self.max_head_bytes + FRAMING_PER_CHUNK * self._chunks:
                self._framing_too_large()

    def _parse(self, data: bytes) -> None:
        """uvicorn's ``data_received`` (the parser fed, what it cannot parse a 400), but a
        request that offers to upgrade the connection (``Connection: Upgrade`` with
        ``Upgrade: h2c``, as curl's ``--http2`` over http://, Java's RestClient and Ktor
        send; ``Upgrade: websocket``) is served as the HTTP/1.1 request it also is, as RFC
        9110 (7.8) allows: the gateway switches to no other protocol.

        httptools stops at such a head as if the rest were another protocol: uvicorn ran
        the request with an empty body (a 400 for any JSON), parsed what followed as a new
        request (a 400, the connection closed), and wrote two warnings for each, whoever
        sent it (Kludex/uvicorn#2722, MagicStack/httptools#124). Here the parser goes on:
        the body it skipped is read with the framing its head declared (the bounds on a
        body hold, its chunks counted), then the requests behind it."""
        self._unset_keepalive_if_required()
        while True:
            try:
                self.parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as offer:
                # stopped at the end of the offer's head (httptools resumed it already)
                data = data[offer.args[0] :]
                framing, self._offer_body = self._offer_body, None
                if framing is not None:
                    self._replaying = True
                    data = framing + data
                if not data:
                    return
            except httptools.HttpParserError:
                message = "Invalid HTTP request received."
                self.logger.warning(message)
                self.send_400_response(message)
                return

    def _should_upgrade(self) -> bool:
        """Never: the gateway switches to no other protocol (its server runs with ``ws``
        "none"; uvicorn would otherwise start no request for a WebSocket offer, and
        :meth:`_parse` hands it no connection to upgrade)."""
        return False

    def _framing_too_large(self) -> None:
        if self._raw.is_closing():  # (a stopped parser: send_400_response does nothing)
            return
        self._refusal = MalformedRequestError(
            f"the chunked body's framing (its size lines and their extensions) takes more than "
            f"{FRAMING_PER_CHUNK} bytes a chunk; send plain chunks or a Content-Length"
        )
        self.send_400_response("")

    def on_url(self, url: bytes) -> None:
        if self._replaying:
            return
        self._head_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._replaying:
            return
        self._head_bytes += len(name) + len(value)
        self._fields += 1
        if self._fields > self.max_headers:
            self._refusal = HeadTooLargeError(
                f"the request head has more than {self.max_headers} header fields"
            )
            raise _ParserStoppedError
        # uvicorn's on_header, inline (a call less a field; tests/unit/test_uvicorn_contract.py
        # holds uvicorn's to these lines)
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def _head_too_large(self, error: HeadTooLargeError | None = None) -> None:
        """Answer 431 now, the head unfinished, and close lingering: what the client still
        sends is read away, never parsed. Behind requests not yet answered (pipelined),
        the 431 follows their answers, then the connection closes (before, it closed at
        once and their answers were lost)."""
        self._head_bytes = -1
        self._disarm()
        if self._raw.is_closing() or self._parser_stopped:  # refused meanwhile
            return
        self.counted(HeadTooLargeError.slug)
        refusal = self._problem(error or self._over_cap())
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            self._after_answer = refusal  # (written by close_lingering once that answer is)
            self._stop_parsing()
            cycle.keep_alive = False
            return
        self._send(refusal)
        self.cycle = _RefusedCycle(keep_alive=False)  # type: ignore[assignment]
        self.close_lingering()

    def _over_cap(self) -> HeadTooLargeError:
        return HeadTooLargeError(f"the request head is over {self.max_head_bytes} bytes")

    def send_400_response(self, msg: str) -> None:
        """What httptools cannot parse, answered as every refusal is (uvicorn's own is
        text/plain), and the connection closed."""
        if self._parser_stopped:
            return  # (a full pipeline: the requests waiting are answered, then it closes)
        bounded, self._refusal = self._refusal, None  # the gateway's own bound, if it stopped the parser
        error = bounded or MalformedRequestError(f"the request is not valid HTTP/1.1: {msg}")
        if isinstance(error, HeadTooLargeError):  # too many fields: as a head too long
            self._head_too_large(error)
            return
        cycle = self.cycle
        if self._body_done and cycle is not None and not cycle.response_complete:
            # a new request's head, behind one whose answer is not all written (pipelined):
            # its 400 follows that answer (written now, it would be read as that one's),
            # then the connection closes; what follows is read away
            self.counted(error.slug)
            self._after_answer = self._problem(error)
            self._stop_parsing()
            cycle.keep_alive = False
            return
        if (
            not self._body_done
            and cycle is not None
            and (cycle.response_started or isinstance(cycle, _RefusedCycle))
        ):
            # answered (or answering: a refusal held, an answer still being sent) already:
            # one more answer would be read as the next request's. The answer goes out, then
            # the connection closes lingering, what follows read away: closed at once, the
            # socket was reset under a client still sending, which lost the 401 it had not
            # read yet (a flaky attack test)
            self._stop_parsing()
            cycle.keep_alive = False
            if cycle.response_complete:
                self.close_lingering()
            return  # (otherwise once it is: uvicorn closes a cycle not kept alive)
        self.counted(error.slug)
        if not self._body_done and self.pipeline and self.pipeline[0][0] is cycle:
            # a body past a bound, its request pipelined behind answers not yet written: it
            # never runs, and its 400 follows them (written now, it went out in place of the
            # answer under way, which was lost); the connection closes after it
            self.pipeline.popleft()
            self.cycle = self._previous_cycle  # type: ignore[assignment]
            if self.cycle is not None:
                self.cycle.keep_alive = False
            self._after_answer = self._problem(error)
            self._stop_parsing()
            return
        self._send(self._problem(error))
        if bounded is None:
            self._raw.close()
            return
        # a body past a bound (its chunks): the route reading it is told the client is gone,
        # and the connection closes lingering, what follows read away, never parsed
        self._stop_parsing()
        if cycle is not None:
            cycle.disconnected = True
            cycle.message_event.set()
        self.cycle = _RefusedCycle(keep_alive=False)  # type: ignore[assignment]
        self.close_lingering()

    def _send(self, data: bytes) -> None:
        """Write an answer the protocol makes itself, after what the routes wrote in this
        turn of the loop (still in :class:`_LingerOnClose`): never ahead of an earlier
        request's answer."""
        self._wrapped.flush()
        self._raw.write(data)

    def _stop_parsing(self) -> None:
        """From here what arrives is read away (up to ``linger_bytes``), never parsed."""
        self._parser_stopped = True
        self._discarded = 0

    def _problem(self, error: GatewayError) -> bytes:
        """``error`` as a whole answer, before any request has a scope: in the error form of
        the door its path (as far as it was read) is on, with the server's default headers
        and ``Connection: close``."""
        try:
            url = getattr(self, "url", b"")  # (none before the first message begins)
            path = httptools.parse_url(url).path.decode("latin-1") if url else ""
        except httptools.HttpParserInvalidURLError:
            path = ""
        problem = error.problem(None, None)
        media_type = in_door_form(problem, error, path)
        body = jsoncodec.dumps(problem)
        return b"".join(
            [
                STATUS_LINE[error.status],
                *(
                    b"".join([name, b": ", value, b"\r\n"])
                    for name, value in self.server_state.default_headers
                ),
                *(
                    b"%s: %s\r\n" % (name.lower().encode("ascii"), value.encode("latin-1"))
                    for name, value in error.headers.items()
                ),
                b"content-type: %s\r\n" % media_type.encode("ascii"),
                b"content-length: %d\r\n" % len(body),
                b"connection: close\r\n\r\n",
                body,
            ]
        )

    def on_response_complete(self) -> None:
        # (``_body_done`` is the newest request's: with requests pipelined behind the one
        # answered, its body came whole before their heads, and uvicorn runs the next)
        if self._body_done or self.pipeline or self.lingering or self._raw.is_closing():
            super().on_response_complete()
            return
        # answered with its body still on its way: the rest is read away (on_body drops it)
        # under a deadline of its own, which the bytes it reads do not move
        self.server_state.total_requests += 1
        self._discarded = 0
        self.flow.resume_reading()
        self._drain_timer = self.loop.call_later(self.linger_seconds, self._drain_late)

    def _drain_late(self) -> None:
        self._drain_timer = None
        if not self._raw.is_closing():
            self._raw.close()

    def _drained(self) -> None:
        """The answered request's body has ended in time: the connection is kept alive."""
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
            if not self._raw.is_closing():
                self._unset_keepalive_if_required()
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )

    def eof_received(self) -> None:
        if self.lingering:
            self._raw.close()  # the client has sent all it will: the answer is read

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        if self._replaying:
            return
        super().on_message_begin()
        self._arrival = self.scope[BODY_ARRIVED] = BodyArrival()  # type: ignore[literal-required]
        self._head_bytes = self._head_wire = 0
        self._head_tail = b""
        self._chunks = self._body_bytes = self._body_wire = self._fields = 0
        self._messages += 1
        self._unset_keepalive_if_required()  # the head's deadline from here
        self._arm()

    def on_headers_complete(self) -> None:
        if self._replaying:  # the head framing an upgrade offer's body: the body follows
            self._replaying = False
            return
        if self._head_bytes > self.max_head_bytes:
            # its last field ended in the read that ended it (httptools hands a field over
            # once it ends): counted here, not after the read, when the request would be
            # under way already
            self._refusal = self._over_cap()
            raise _ParserStoppedError
        if len(self.pipeline) >= self.max_pipelined:
            self._stop_pipeline()
        self._head_bytes = -1
        self._disarm()
        self._offer_body = None
        if self.parser.should_upgrade():
            # an upgrade offer (or CONNECT): httptools skips its body and stops (_parse)
            try:
                self._offer_body = _skipped_framing(self.headers)
            except MalformedRequestError as error:
                self._refusal = error
                raise _ParserStoppedError from None
        self._body_done = False
        shed = self.head_shed
        if shed is not None and (self.cycle is None or self.cycle.response_complete):
            if shed.armed():
                refusal = self._head_refusal(shed)
                if refusal is not None:
                    self._refuse(shed, refusal)
                    return
            if self.parser.get_method() == b"POST":
                # counted as its caller's upload until its task first runs (the route
                # counts its own from there): a storm's heads, parsed in one turn of the
                # loop before any route runs, see those ahead of them
                self.loop.call_soon(shed.arrived(self.scope))  # type: ignore[arg-type]
        self._previous_cycle = self.cycle
        super().on_headers_complete()
        if self.aged and self.cycle is not None:
            self.cycle.keep_alive = False  # past its age: the last answer on the connection

    def _stop_pipeline(self) -> None:
        """A head beyond the pipeline's bound: the parser stops here (raising from its
        callback), the last request waiting closes the connection once answered, and
        what arrives meanwhile is read away (up to ``linger_bytes``)."""
        self._stop_parsing()
        self.pipeline[0][0].keep_alive = False  # (appended on the left: the newest)
        self.counted(PIPELINE_FULL)
        raise _ParserStoppedError

    def _head_refusal(self, shed: HeadShed) -> HeadRefusal | None:
        """The head's refusal, its scope filled in as uvicorn fills it (only a POST is
        ever refused here, so nothing is parsed for the rest)."""
        if self.parser.get_method() != b"POST":
            return None
        scope = self.scope
        parsed = httptools.parse_url(self.url)
        path = parsed.path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["method"] = "POST"
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + parsed.path
        scope["query_string"] = parsed.query or b""
        try:
            return shed.refuse(scope)  # type: ignore[arg-type]
        except Exception:  # a bug here must not cost the request its answer: the route gives it
            logger.exception("the refusal from the request head failed; the route answers")
            return None

    def _refuse(self, shed: HeadShed, refusal: HeadRefusal) -> None:
        """Answer ``refusal`` (after its hold), then go on as uvicorn does after an answer:
        keep the connection, or close it lingering."""
        keep_alive = (
            not refusal.close and self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        )
        cycle = _RefusedCycle(keep_alive)
        self.cycle = cycle  # type: ignore[assignment]
        head = [STATUS_LINE[refusal.status]]
        for name, value in (*self.server_state.default_headers, *refusal.headers):
            head += [name, b": ", value, b"\r\n"]
        if not keep_alive and not refusal.close:
            head.append(b"connection: close\r\n")
        head += [b"\r\n", refusal.body]
        data = b"".join(head)
        if refusal.hold:
            # reading goes on: the body is read away, and a request pipelined behind waits
            # for this answer as behind any other (uvicorn's pipeline)
            self.loop.call_later(refusal.hold, self._write_refusal, shed, refusal, cycle, data)
        else:
            self._write_refusal(shed, refusal, cycle, data)

    def _write_refusal(self, shed: HeadShed, refusal: HeadRefusal, cycle: _RefusedCycle, data: bytes) -> None:
        """Write a refusal from the head once its hold is over (a method, not a closure
        that schedules itself: that is a reference cycle, which kept every refusal and
        its call scope until the garbage collector found them)."""
        # the hold counts from the request's head: the loop's timers run on a clock read
        # once an iteration, in whole milliseconds, and may fire a little early
        early = refusal.hold - (perf_counter() - refusal.started)
        if early > 0 and not self._raw.is_closing():
            self.loop.call_later(early, self._write_refusal, shed, refusal, cycle, data)
            return
        cycle.response_complete = True
        if not self._raw.is_closing():
            self._send(data)
        shed.answered(refusal)
        if cycle.keep_alive:  # (the server's shutdown may have cleared it during the hold)
            self.on_response_complete()  # resumes reading, the keep-alive timer or the next request
        else:
            self.close_lingering()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if isinstance(self.cycle, _RefusedCycle):
            return  # read away: a refused request's body is never used
        super().on_body(body)

    def on_chunk_header(self) -> None:
        """httptools, as a chunk's size line is parsed: past the chunks the body so far
        allows, the parser stops (uvicorn then calls :meth:`send_400_response`)."""
        self._chunks += 1
        if self._chunks > FREE_CHUNKS + self._body_bytes // self.min_chunk_bytes:
            self._refusal = MalformedRequestError(
                f"the chunked body comes in more than {FREE_CHUNKS} chunks plus one per "
                f"{self.min_chunk_bytes} bytes; send it in larger chunks or with a Content-Length"
            )
            raise _ParserStoppedError

    def on_message_complete(self) -> None:
        if self._offer_body is not None:
            return  # (httptools skipped the offer's body: it is read next, _parse)
        self._body_done = True
        self._arrival.done = True  # (this message's: the newest)
        self._drained()
        if isinstance(self.cycle, _RefusedCycle):
            self.cycle.more_body = False
            return
        super().on_message_complete()

    def pause_writing(self) -> None:
        """The transport's buffer is over its high-water mark (the client is not taking
        the answer): the send deadline runs until it drains below the low-water mark."""
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_seconds, self._send_late)
        super().pause_writing()

    def resume_writing(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().resume_writing()

    def _aged(self) -> None:
        """The connection is ``max_age_seconds`` old: closed now if idle, else after the
        answer under way (its head says so), and cut ``age_grace_seconds`` from now."""
        self._age_timer = None
        self.aged = True
        if self._raw.is_closing():
            return
        self._age_timer = self.loop.call_later(self.age_grace_seconds, self._reset)
        if self._head_bytes >= 0:
            return  # a head under way: answered with Connection: close (on_headers_complete)
        # uvicorn's: idle, it closes; else the newest request (the last of any pipelined
        # ones) is not kept alive, so what was received is answered, then it closes
        self.shutdown()

    def _send_late(self) -> None:
        """The client took nothing for ``send_seconds``: aborted (closing would wait for the
        unsent bytes to go, which they never do)."""
        self._send_timer = None
        self._reset()

    def _reset(self) -> None:
        """End the connection now, what is unsent dropped by the kernel too: aborted alone,
        the socket closes but the kernel keeps what it holds of the answer (megabytes) and
        goes on offering it to a client that takes nothing (15 such sockets held 59 MiB of
        the host's TCP memory past the send deadline, until their clients closed). A zero
        linger makes the close a reset, which frees it at once."""
        sock = self._raw.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        self._raw.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._address is not None and self.addresses is not None:
            self.addresses.give_back(self._address)
            self._address = None
        self._disarm()
        # uvicorn cancels its keep-alive timer only when the connection closes cleanly: one
        # its client resets (as a proxy purging idle connections does) was held, with its
        # last request's scope and cycle, until the timer fired (Soju06/codex-lb#2041)
        self._unset_keepalive_if_required()
        for timer in (self._linger_timer, self._drain_timer, self._send_timer, self._age_timer):
            if timer is not None:
                timer.cancel()
        self._drain_timer = None
        self._send_timer = None
        self._age_timer = None
        self.lingering = False
        super().connection_lost(exc)
