"""Quotas per key over a day or a month, tiers in the keys file, and what an operator sees
of a key (GET /admin/keys/{id}). Counted in this process here (no Redis); the shared
counters are tested against a real Redis in tests/e2e."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.errors import ConfigurationError
from gateway.settings import AdminSettings, AuthSettings, Settings, TierSettings
from gateway.shared.keyfiles import Quota, hash_key, parse_keys
from gateway.shared.quota import period_of

from helpers.support import FakeBackend, chelsea_jpeg

TEXT = {"text": "The striker scored twice."}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    keys, admin = tmp_path / "keys", tmp_path / "admin"
    keys.write_text(
        f"capped {hash_key('capped-secret')} tier=gold quota=3/day\n"
        f"images {hash_key('images-secret')} 100 100 image-quota=5/month\n"
        f"free {hash_key('free-secret')}\n"
    )
    admin.write_text(f"operator {hash_key('operator-secret')}\n")
    settings = Settings(
        auth=AuthSettings(keys_file=keys),
        admin=AdminSettings(keys_file=admin),
        tiers={"standard": TierSettings(), "gold": TierSettings(share=4, priority=1)},
    )
    with TestClient(create_app(settings, backend_factory=lambda *_: FakeBackend())) as test_client:
        yield test_client


def test_a_spent_request_quota_is_429_until_the_day_ends(client: TestClient) -> None:
    key = {"X-API-Key": "capped-secret"}
    answers = [client.post("/classify", json=TEXT, headers=key) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert answers[0].headers["ratelimit-policy"] == '"requests-day";q=3;w=86400'
    assert answers[2].headers["ratelimit"].startswith('"requests-day";r=0;t=')
    spent = client.post("/classify", json=TEXT, headers=key)
    assert spent.status_code == 429
    assert spent.headers["content-type"] == "application/problem+json"
    assert spent.json()["type"].endswith(":quota-exceeded")
    _, ends = period_of(Quota("requests", 3, "day"), datetime.now(UTC))
    assert 0 < int(spent.headers["retry-after"]) <= (ends - datetime.now(UTC)).total_seconds() + 1
    # others are not affected
    assert client.post("/classify", json=TEXT, headers={"X-API-Key": "free-secret"}).status_code == 200


def test_images_count_against_an_image_quota_and_a_refused_request_takes_nothing(
    client: TestClient,
) -> None:
    key = {"X-API-Key": "images-secret"}
    photo = chelsea_jpeg()
    three = [("file", (f"{i}.jpg", photo, "image/jpeg")) for i in range(3)]
    assert client.post("/classify", files=three, headers=key).status_code == 200
    refused = client.post("/classify", files=three, headers=key)  # 3 more would make 6 > 5
    assert refused.status_code == 429
    assert refused.json()["type"].endswith(":quota-exceeded")
    two = three[:2]
    answer = client.post("/classify", files=two, headers=key)  # the refused 3 were given back
    assert answer.status_code == 200
    assert '"images-month";r=0' in answer.headers["ratelimit"]
    assert '"default"' in answer.headers["ratelimit-policy"]  # beside its per-second limit
    assert client.post("/classify", json=TEXT, headers=key).status_code == 200  # texts are not images


def test_an_operator_sees_a_keys_tier_and_use(client: TestClient) -> None:
    client.post("/classify", json=TEXT, headers={"X-API-Key": "capped-secret"})
    admin = {"X-API-Key": "operator-secret"}
    standing = client.get("/admin/keys/capped", headers=admin)
    assert standing.status_code == 200
    body = standing.json()
    assert body["tier"] == "gold"
    assert body["share"] == 4
    assert body["priority"] == 1
    assert body["quotas"][0] | {"reset_seconds": 0} == {
        "unit": "requests",
        "period": "day",
        "limit": 3,
        "used": 1,
        "remaining": 2,
        "reset_seconds": 0,
    }
    assert "digest" not in standing.text
    assert client.get("/admin/keys/nobody", headers=admin).status_code == 404
    assert client.get("/admin/keys/capped", headers={"X-API-Key": "capped-secret"}).status_code == 401


def test_keys_file_options_are_checked_line_by_line(tmp_path: Path) -> None:
    digest = hash_key("x")
    path = tmp_path / "keys"
    parsed = parse_keys(
        f"a {digest} 5 tier=gold quota=10/month image-quota=7/day\n", path, {"standard", "gold"}
    )
    assert parsed[0].tier == "gold"
    assert parsed[0].quotas == (Quota("requests", 10, "month"), Quota("images", 7, "day"))
    for bad in (
        "quota=0/day",
        "quota=5/week",
        "tier=Gold",
        "tier=silver",
        "colour=red",
        "quota=1/day quota=2/day",
    ):
        with pytest.raises(ConfigurationError, match=r"keys:1"):
            parse_keys(f"a {digest} {bad}\n", path, {"standard", "gold"})
    with pytest.raises(ConfigurationError):
        parse_keys(f"a {digest} tier=gold 5\n", path, None)  # options after the positional fields


def test_an_unknown_tier_refuses_to_start(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"a {hash_key('x')} tier=platinum\n")
    with pytest.raises(ConfigurationError, match="platinum"):
        create_app(Settings(auth=AuthSettings(keys_file=keys)), backend_factory=lambda *_: FakeBackend())


def test_periods_are_utc_days_and_months() -> None:
    now = datetime(2026, 2, 28, 23, 59, tzinfo=UTC)
    assert period_of(Quota("requests", 1, "day"), now) == ("2026-02-28", datetime(2026, 3, 1, tzinfo=UTC))
    assert period_of(Quota("requests", 1, "month"), now) == ("2026-02", datetime(2026, 3, 1, tzinfo=UTC))
