"""Bounds on a JSON body's structure, checked while it arrives and before it is parsed.

A JSON parser turns bytes into objects at a rate no cap on bytes can bound: 40 MiB of
``[[]],`` becomes ten million lists (2 GiB) in one C call that holds the GIL, so the
event loop stalls whichever thread runs it. :class:`JsonScan` reads the body chunk by
chunk, as it comes off the wire (after decompression), and refuses it at the first fact
that proves no valid request looks like it: nesting deeper than ``max_depth``, more
strings, containers and separators than ``max_tokens``, a string longer than
``max_string_bytes``, more bytes outside strings than ``max_bare_bytes``, or a text
request larger than its own cap. It does not parse: it counts. Strings are skipped at
``memchr`` speed (``bytes.find``); only the bytes outside strings, which a valid request
has few of, go through a regular expression. Each step is bounded by one chunk.

The body that passes is parsed by :func:`parse_scanned`: whole by orjson when small, else
with its long strings (base64 images, mostly) cut out by the scan's offsets and decoded
piece by piece, so no single C call holds the GIL for long; what is left is a small
skeleton for orjson. Grammar, UTF-8 and NaN are the parser's to judge, as before.
"""

from __future__ import annotations

import codecs
import re
import secrets
from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidInputError, MalformedRequestError, PayloadTooLargeError

# A string longer than this is cut out of the skeleton and decoded in pieces of PIECE.
SPLICE_BYTES = 64 * 1024
PIECE = 1024 * 1024
# Bodies up to this size, read in one message, are parsed at once: the worst a parser can
# make of them (a quarter of a million empty lists, about 15 MiB, 2 ms) is bounded.
WHOLE_BYTES = 256 * 1024

_BARE = re.compile(rb'["\[\]{},]')
# the rest of a string with escapes in it: up to its closing quote, or to the end of the
# chunk (a trailing lone backslash is left for the next chunk)
_ESCAPED_TAIL = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*')
_CONTROL_BYTES = bytes(range(0x20))


@dataclass(frozen=True)
class JsonBounds:
    """What a valid body of one route can hold."""

    max_depth: int
    max_tokens: int  # strings (keys included), arrays, objects and commas
    max_string_bytes: int  # one string, as written (escapes included)
    max_bare_bytes: int  # outside strings: numbers, literals, whitespace, colons
    text_keys: frozenset[bytes] = frozenset()  # top-level strings that make it a text request
    text_limit: int = 0  # the body cap of a text request


@dataclass(frozen=True)
class Span:
    """A long string in the body: its content's offsets and whether it has escapes."""

    start: int
    end: int
    escaped: bool


class JsonScan:
    """The structural scan of one body, fed in order; raises a ClientError on the first
    bound a valid request never crosses."""

    def __init__(self, bounds: JsonBounds) -> None:
        self.bounds = bounds
        self.size = 0  # bytes fed
        self.depth = 0
        self.tokens = 0
        self.bare = 0
        self.text = False
        self.spans: list[Span] = []
        self._string_start = -1  # offset of the open string's content, -1: not in one
        self._escaped = False  # the open string has a backslash
        self._pending_escape = False  # the last chunk ended in the middle of an escape

    def feed(self, chunk: bytes) -> None:
        base = self.size
        self.size += len(chunk)
        if self.text and self.size > self.bounds.text_limit:
            raise PayloadTooLargeError(
                f"a text request may be at most {self.bounds.text_limit} bytes; this one is larger"
            )
        position = 0
        end = len(chunk)
        while position < end:
            if self._string_start >= 0:
                position = self._in_string(chunk, position, base)
                continue
            found = _BARE.search(chunk, position)
            stop = end if found is None else found.start()
            self._bare(stop - position)
            if found is None:
                return
            position = stop + 1
            self._token(chunk[stop], base + position)

    def finish(self) -> None:
        """The body is complete (its grammar is the parser's to judge)."""
        if self._string_start >= 0 or self.depth:
            raise MalformedRequestError("the body is not valid JSON")

    # -- one step each ------------------------------------------------------------------
    def _bare(self, count: int) -> None:
        self.bare += count
        if self.bare > self.bounds.max_bare_bytes:
            raise PayloadTooLargeError(
                f"the JSON body has over {self.bounds.max_bare_bytes} bytes outside its strings"
            )

    def _token(self, byte: int, after: int) -> None:
        self.tokens += 1
        if self.tokens > self.bounds.max_tokens:
            raise PayloadTooLargeError(
                f"the JSON body holds over {self.bounds.max_tokens} values and separators; "
                "no request to this route needs that many"
            )
        if byte == 0x22:  # "
            self._string_start, self._escaped = after, False
        elif byte in (0x5B, 0x7B):  # [ {
            self.depth += 1
            if self.depth > self.bounds.max_depth:
                raise InvalidInputError(
                    f"the JSON body is nested over {self.bounds.max_depth} levels deep; "
                    "no request to this route is"
                )
        elif byte in (0x5D, 0x7D):  # ] }
            self.depth -= 1
            if self.depth < 0:
                raise MalformedRequestError("the body is not valid JSON")

    def _in_string(self, chunk: bytes, position: int, base: int) -> int:
        """Skip string content from ``position``; the offset after its closing quote, or
        the chunk's end."""
        if self._pending_escape:  # the escaped byte opened this chunk
            self._pending_escape = False
            position += 1
            if position >= len(chunk):
                return self._string_grew(len(chunk), base)
        quote = chunk.find(b'"', position)
        if chunk.find(b"\\", position, len(chunk) if quote < 0 else quote) < 0:
            # the common case, no escapes: the quote (if any) closes the string
            return (
                self._string_grew(len(chunk), base) if quote < 0 else self._close_string(chunk, quote, base)
            )
        self._escaped = True
        match = _ESCAPED_TAIL.match(chunk, position)
        assert match is not None  # it matches the empty string
        stop = match.end()
        if stop < len(chunk) and chunk[stop] == 0x22:
            return self._close_string(chunk, stop, base)
        if stop < len(chunk):  # a lone backslash ends the chunk: its escaped byte comes next
            self._pending_escape = True
        return self._string_grew(len(chunk), base)

    def _string_grew(self, end: int, base: int) -> int:
        if base + end - self._string_start > self.bounds.max_string_bytes:
            raise PayloadTooLargeError(
                f"a string in the JSON body is over {self.bounds.max_string_bytes} bytes"
            )
        return end

    def _close_string(self, chunk: bytes, quote: int, base: int) -> int:
        start, end = self._string_start, base + quote
        self._string_start = -1
        self._string_grew(quote, base)
        if end - start > SPLICE_BYTES:
            self.spans.append(Span(start, end, self._escaped))
        elif self.depth == 1 and self.bounds.text_keys and not self.text:
            content = chunk[start - base : quote] if start >= base else None
            if content in self.bounds.text_keys:
                self.text = True
                if self.size > self.bounds.text_limit:
                    raise PayloadTooLargeError(
                        f"a text request may be at most {self.bounds.text_limit} bytes; this one is larger"
                    )
        return quote + 1


def _decode_plain(raw: memoryview) -> str:
    """A string with no escapes, decoded a piece at a time (each call bounded)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pieces = []
    try:
        for offset in range(0, len(raw), PIECE):
            piece = raw[offset : offset + PIECE]
            if len(bytes(piece).translate(None, _CONTROL_BYTES)) != len(piece):
                raise MalformedRequestError(
                    "the body is not valid JSON (a raw control character in a string)"
                )
            pieces.append(decoder.decode(piece, final=offset + PIECE >= len(raw)))
    except UnicodeDecodeError as exc:
        raise MalformedRequestError("the body is not valid UTF-8") from exc
    return "".join(pieces)


def _decode_escaped(raw: memoryview, judge: Any) -> str:
    """A string with escapes: one parse of that string alone (bounded by max_string_bytes)."""
    value = judge(b'"' + bytes(raw) + b'"')
    if not isinstance(value, str):
        raise MalformedRequestError("the body is not valid JSON")
    return value


def parse_scanned(body: bytes | bytearray | memoryview, spans: list[Span], parse: Any, judge: Any) -> Any:
    """The document in ``body``, whose long strings are ``spans``: ``parse`` (the whole
    document parser) runs on a skeleton with each long string replaced by a placeholder
    no client can guess, then each is decoded in pieces and put back."""
    view = memoryview(body)
    if not spans:
        return parse(bytes(view))
    nonce = secrets.token_hex(16)
    parts: list[bytes] = []
    previous = 0
    for index, span in enumerate(spans):
        parts.append(bytes(view[previous : span.start]))
        parts.append(f"\\u0000{nonce}:{index}".encode())
        previous = span.end
    parts.append(bytes(view[previous:]))
    skeleton = parse(b"".join(parts))
    marker = f"\x00{nonce}:"
    strings = [
        _decode_escaped(view[s.start : s.end], judge) if s.escaped else _decode_plain(view[s.start : s.end])
        for s in spans
    ]

    def put_back(value: Any) -> Any:
        if isinstance(value, str) and value.startswith(marker):
            return strings[int(value[len(marker) :])]
        if isinstance(value, list):
            return [put_back(item) for item in value]
        if isinstance(value, dict):
            return {put_back(key): put_back(item) for key, item in value.items()}
        return value

    return put_back(skeleton)
