"""The HTTP door's connections by client address (gateway.http.addresses): an address past
its bound is answered 429 at once, before any request, and closed; an IPv6 client is
counted by its /64."""

from __future__ import annotations

import asyncio

import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.http.addresses import AddressConnections
from gateway.http.protocol import HeaderTimeoutProtocol

from helpers.transport import RecordingTransport


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("10.1.2.3", 5000), "10.1.2.3"),
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:bbbb::9", 6000, 0, 0), "2001:db8:1:2::/64"),
        (("::ffff:10.1.2.3", 5000, 0, 0), "10.1.2.3"),
        (("fe80::1%eth0", 5000, 0, 2), "fe80::/64"),
        ("/run/gateway.sock", None),
        (None, None),
    ],
)
def test_a_connection_is_counted_under_its_address_or_its_64(peer: object, key: str | None) -> None:
    assert AddressConnections.key(peer) == key


def test_an_address_takes_up_to_its_bound_and_gets_back_what_it_gives() -> None:
    addresses = AddressConnections(2)
    assert addresses.take("a")
    assert addresses.take("a")
    assert not addresses.take("a")
    assert addresses.take("b")  # another address is not held up
    addresses.give_back("a")
    assert addresses.take("a")
    for _ in range(2):
        addresses.give_back("a")
    assert addresses.held("a") == 0


class _Protocol(HeaderTimeoutProtocol):
    addresses = AddressConnections(1)


def _connect(loop: asyncio.AbstractEventLoop) -> tuple[_Protocol, RecordingTransport]:
    config = uvicorn.Config(lambda *_: None, http="httptools", lifespan="off", log_config=None)
    protocol = _Protocol(config, ServerState(), {}, _loop=loop)
    transport = RecordingTransport()
    protocol.connection_made(transport)
    return protocol, transport


def test_a_connection_past_its_addresses_bound_is_answered_429_at_once_and_closed() -> None:
    loop = asyncio.new_event_loop()
    try:
        first, first_transport = _connect(loop)
        assert not first_transport.written
        second, second_transport = _connect(loop)
        [answer] = second_transport.written
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 429 ")
        assert b"retry-after: 1" in head
        assert b"connection: close" in head
        assert b"too-many-connections" in body
        assert second_transport.closed
        second.connection_lost(None)  # a refused connection gives back nothing it did not take
        first.connection_lost(None)
        third, third_transport = _connect(loop)
        assert not third_transport.closed  # the address's connection is back
        third.connection_lost(None)
        assert _Protocol.addresses is not None
        assert _Protocol.addresses.held("127.0.0.1") == 0
    finally:
        loop.close()
