"""The real app with a fake backend, for faults a real Triton cannot produce on demand."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.settings import Settings

from helpers.support import FakeBackend


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def settings() -> Settings:
    return Settings()


@pytest.fixture
def client(backend: FakeBackend, settings: Settings) -> Iterator[TestClient]:
    app = create_app(settings, backend_factory=lambda *_: backend)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client
    assert backend.closed
