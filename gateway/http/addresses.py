"""How many of the HTTP door's connections each client address holds, and the bound on it
(``server.max_connections_per_address``): one address, however it renews its sockets, never
holds the whole door. An IPv6 client is counted by its /64, the least a host is given."""

from __future__ import annotations

import ipaddress


class AddressConnections:
    """Connections held, by client address; ``take`` refuses past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}

    @staticmethod
    def key(peer: object) -> str | None:
        """The address a connection is counted under (None: not an IP peer, not counted)."""
        if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
            return None
        host = peer[0]
        if ":" not in host:
            return host
        try:
            address = ipaddress.IPv6Address(host.partition("%")[0])
        except ValueError:
            return host
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))

    def take(self, key: str) -> bool:
        held = self._held.get(key, 0)
        if held >= self.limit:
            return False
        self._held[key] = held + 1
        return True

    def give_back(self, key: str) -> None:
        held = self._held.get(key, 0) - 1
        if held > 0:
            self._held[key] = held
        else:
            self._held.pop(key, None)

    def held(self, key: str) -> int:
        return self._held.get(key, 0)
