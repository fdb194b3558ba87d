"""A DNS server for tests: answers A queries for the names it is given (what Docker's
embedded DNS does for a compose service with several replicas), so HAProxy's `resolvers`
can be run for real against local processes. UDP only, one question per query."""

from __future__ import annotations

import socket
import struct
import threading
from types import TracebackType

TYPE_A = 1
CLASS_IN = 1


def _question(query: bytes) -> tuple[str, int, int]:
    """The first question's (name, type, end offset) of a DNS query."""
    labels: list[str] = []
    offset = 12
    while query[offset]:
        length = query[offset]
        labels.append(query[offset + 1 : offset + 1 + length].decode("ascii").lower())
        offset += 1 + length
    offset += 1
    qtype = struct.unpack_from("!H", query, offset)[0]
    return ".".join(labels), qtype, offset + 4


class DnsStub:
    """``records``: name -> IPv4 addresses, changeable while it runs (``set``)."""

    def __init__(self, records: dict[str, list[str]]) -> None:
        self._records = {name.lower(): list(addresses) for name, addresses in records.items()}
        self._lock = threading.Lock()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="dns-stub", daemon=True)
        self.queries = 0

    @property
    def address(self) -> str:
        host, port = self._socket.getsockname()
        return f"{host}:{port}"

    def set(self, name: str, addresses: list[str]) -> None:
        with self._lock:
            self._records[name.lower()] = list(addresses)

    def answer(self, query: bytes) -> bytes:
        (ident,) = struct.unpack_from("!H", query)
        name, qtype, end = _question(query)
        with self._lock:
            known = name in self._records
            addresses = self._records.get(name, []) if qtype == TYPE_A else []
        flags = 0x8180 if known else 0x8183  # response, recursion desired/available; NXDOMAIN
        header = struct.pack("!HHHHHH", ident, flags, 1, len(addresses), 0, 0)
        answers = b"".join(
            struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, 1, 4) + socket.inet_aton(address)
            for address in addresses
        )
        return header + query[12:end] + answers

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, peer = self._socket.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.queries += 1
            self._socket.sendto(self.answer(query), peer)

    def __enter__(self) -> DnsStub:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._socket.close()
