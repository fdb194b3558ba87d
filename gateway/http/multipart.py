"""The ``file`` parts of a ``multipart/form-data`` body, parsed as it arrives.

python-multipart's streaming parser, fed the body a piece at a time, with each ``file``
part's bytes gathered in memory. Starlette's form parser spools every file to a temporary
file through the thread pool (a thread hop per piece and per part); the images are held
in memory anyway, to be checked and sent to Triton, so that costs time and buys nothing.

Every bound is checked while the body streams in, before more of it is held: the number
of parts, of ``file`` parts (the image cap), each image's size and each part's headers.
Other fields are skipped unread (a body cap bounds them). A body that ends before its
closing boundary is malformed, not a shorter list of images.
"""

from __future__ import annotations

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from gateway.errors import InvalidInputError, MalformedRequestError, PayloadTooLargeError

# the headers of one part (Content-Disposition, Content-Type, ...), all together
MAX_PART_HEADER_BYTES = 16 * 1024


def boundary_of(content_type: str) -> bytes:
    """The boundary a ``multipart/form-data`` Content-Type declares."""
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise MalformedRequestError("the multipart Content-Type has no boundary")
    return boundary


class FileParts:
    """Feed it the body's pieces (:meth:`feed`), then :meth:`finish` for the images, in
    order. Errors name the image (``input_index``) they are about."""

    def __init__(self, boundary: bytes, *, max_parts: int, max_files: int, max_file_bytes: int) -> None:
        self._max_parts = max_parts
        self._max_files = max_files
        self._max_file_bytes = max_file_bytes
        self.files: list[bytes] = []
        self._parts = 0
        # the file part being read, as views of the pieces (None: skipped)
        self._current: list[memoryview] | None = None
        self._size = 0
        self._header_bytes = 0
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition = b""
        self._ended = False
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._part_begin,
                "on_part_data": self._part_data,
                "on_part_end": self._part_end,
                "on_header_field": self._header_field,
                "on_header_value": self._header_value_piece,
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_end": self._end,
            },
        )

    def feed(self, piece: bytes) -> None:
        try:
            self._parser.write(piece)
        except MultipartParseError as exc:
            raise MalformedRequestError("the multipart body is malformed") from exc

    def finish(self) -> list[bytes]:
        try:
            self._parser.finalize()
        except MultipartParseError as exc:
            raise MalformedRequestError("the multipart body is malformed") from exc
        if not self._ended:
            raise MalformedRequestError("the multipart body ends before its closing boundary")
        if not self.files:
            raise InvalidInputError("no images ('file' parts) given")
        return self.files

    def close(self) -> None:
        """Let the parser go (it holds this object's methods as its callbacks: a reference
        cycle, otherwise freed only when the garbage collector walks it)."""
        self._parser.callbacks = {}

    # -- the parser's callbacks ------------------------------------------------------
    def _part_begin(self) -> None:
        self._parts += 1
        if self._parts > self._max_parts:
            raise MalformedRequestError(f"the multipart body has over {self._max_parts} parts")
        self._current = None
        self._header_bytes = 0
        self._disposition = b""

    def _count_header(self, count: int) -> None:
        self._header_bytes += count
        if self._header_bytes > MAX_PART_HEADER_BYTES:
            raise MalformedRequestError(f"a multipart part's headers exceed {MAX_PART_HEADER_BYTES} bytes")

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_name += data[start:end]

    def _header_value_piece(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        name = options.get(b"name")
        if name is None:
            raise MalformedRequestError('a multipart part\'s Content-Disposition has no "name"')
        if name != b"file":
            return  # another field: skipped
        index = len(self.files)
        if index >= self._max_files:
            raise PayloadTooLargeError(
                f"over {self._max_files} images ('file' parts) in one request; the limit is {self._max_files}"
            )
        if b"filename" not in options:
            raise InvalidInputError("a 'file' part must be a file upload").at(index)
        self._current = []
        self._size = 0

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        current = self._current
        if current is None:
            return
        self._size += end - start
        if self._size > self._max_file_bytes:
            raise PayloadTooLargeError(
                f"the image is over {self._max_file_bytes} bytes; the limit is {self._max_file_bytes}"
            ).at(len(self.files))
        current.append(memoryview(data)[start:end])  # copied once, when the part ends

    def _part_end(self) -> None:
        if self._current is not None:
            self.files.append(b"".join(self._current))
            self._current = None

    def _end(self) -> None:
        self._ended = True
