"""Ports the local launcher, the benchmark and the fixtures hand to servers they start."""

from __future__ import annotations

from gateway.dev.tritonserver import free_ports


def test_ports_chosen_together_are_distinct() -> None:
    """Taken one after another, a port can come back twice (Triton once got one port for
    HTTP and metrics, and refused to start): chosen together, never."""
    for _ in range(200):
        ports = free_ports(3)
        assert len(set(ports)) == 3
    assert len(set(free_ports(64))) == 64
