"""Prometheus config and rules (promtool) and Grafana dashboards (Grafana's own schema)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"
SCHEMA_CHECK = GRAFANA / "schema-check"


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: `make test` installs it (apt package prometheus)")
    return found


def run(*command: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=300)


def test_promtool_check_config() -> None:
    # --syntax-only: the Prometheus key's file (/run/secrets/prometheus-key) exists in its container only
    result = run(tool("promtool"), "check", "config", "--syntax-only", str(PROMETHEUS / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_rules() -> None:
    result = run(tool("promtool"), "check", "rules", *map(str, sorted((PROMETHEUS / "rules").glob("*.yml"))))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout
    assert "SUCCESS: 10 rules found" in result.stdout


def test_promtool_test_rules() -> None:
    result = run(tool("promtool"), "test", "rules", str(PROMETHEUS / "tests" / "rules_test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_tests_can_fail(tmp_path: Path) -> None:
    broken = (PROMETHEUS / "tests" / "rules_test.yml").read_text().replace("value: 0.04", "value: 0.05")
    (tmp_path / "rules").symlink_to(PROMETHEUS / "rules")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "broken.yml").write_text(broken)
    result = run(tool("promtool"), "test", "rules", str(tmp_path / "tests" / "broken.yml"))
    assert result.returncode != 0


def test_dashboards_are_generated_from_source() -> None:
    result = run(sys.executable, str(GRAFANA / "generate.py"), "--check")
    assert result.returncode == 0, result.stderr


def _typecheck(dashboards: dict[str, dict[str, object]], workdir: Path) -> subprocess.CompletedProcess[str]:
    """Embed each dashboard inline in a .ts file typed as Grafana's `Dashboard`, run tsc."""
    tsc = SCHEMA_CHECK / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():
        pytest.fail(f"{tsc} is missing: `make test` runs npm ci in {SCHEMA_CHECK}")
    (workdir / "node_modules").symlink_to(SCHEMA_CHECK / "node_modules")
    for name, body in dashboards.items():
        (workdir / f"{name}.ts").write_text(
            'import type { Dashboard } from "@grafana/schema";\n'
            f"export const dashboard: Dashboard = {json.dumps(body, indent=2)};\n"
        )
    (workdir / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "strict": True,
                    "noEmit": True,
                    "module": "esnext",
                    "moduleResolution": "bundler",
                    "target": "es2022",
                    "skipLibCheck": True,
                },
                "include": ["*.ts"],
            }
        )
    )
    return run(str(tsc), "-p", str(workdir / "tsconfig.json"), cwd=workdir)


def load_dashboards() -> dict[str, dict[str, object]]:
    return {
        path.stem: json.loads(path.read_text()) for path in sorted((GRAFANA / "dashboards").glob("*.json"))
    }


def test_dashboards_match_grafana_schema(tmp_path: Path) -> None:
    dashboards = load_dashboards()
    assert set(dashboards) == {
        "gateway-overview",
        "triton-models",
        "latency-breakdown",
        "model-quality",
        "capacity",
    }
    result = _typecheck(dashboards, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_can_fail(tmp_path: Path) -> None:
    broken = load_dashboards()["gateway-overview"]
    broken["schemaVersion"] = "thirty-nine"  # must be a number
    broken["panels"][0]["gridPos"] = {"x": 0}  # type: ignore[index]  # h, w, y missing
    result = _typecheck({"broken": broken}, tmp_path)
    assert result.returncode != 0
    assert "Type 'string' is not assignable to type 'number'" in result.stdout
    assert "'GridPos': h, w, y" in result.stdout


def test_provisioning_points_at_the_dashboards() -> None:
    provider = (GRAFANA / "provisioning" / "dashboards" / "triton-gateway.yml").read_text()
    assert "/var/lib/grafana/dashboards/triton-gateway" in provider
    datasource = (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    assert "uid: prometheus" in datasource
    for body in load_dashboards().values():
        variables = body["templating"]["list"]  # type: ignore[index]
        assert variables[0]["current"]["value"] == "prometheus"


def test_prometheus_scrapes_a_keyed_gateway_with_its_own_key(tmp_path: Path) -> None:
    """With keys, /metrics needs one: a real Prometheus given the shipped scrape job's
    authorization (a bearer key from a file) scrapes it; one without is refused."""
    import time

    import httpx

    from gateway.app import create_app
    from gateway.settings import Settings
    from gateway.shared.keyfiles import hash_key

    from helpers.support import FakeBackend, ServedApp, running_prometheus

    keys = tmp_path / "keys"
    keys.write_text(f"prometheus {hash_key('scrape-key')}\n")
    key_file = tmp_path / "prometheus-key"
    key_file.write_text("scrape-key\n")  # as `make keys` writes it (a trailing newline)
    settings = Settings(auth={"keys_file": keys})
    gateway = ServedApp(create_app(settings, backend_factory=lambda *_: FakeBackend()), settings).start()
    try:
        assert httpx.get(f"{gateway.url}/metrics", timeout=10).status_code == 401
        for key, expected in ((key_file, "1"), (None, "0")):
            folder = tmp_path / ("keyed" if key else "anonymous")
            folder.mkdir()
            with running_prometheus(gateway.url, folder, credentials_file=key) as prometheus:
                deadline = time.monotonic() + 20
                while True:
                    result = httpx.get(
                        f"{prometheus}/api/v1/query", params={"query": "up"}, timeout=10
                    ).json()
                    values = [item["value"][1] for item in result["data"]["result"]]
                    if values:
                        break
                    assert time.monotonic() < deadline, "no scrape"
                    time.sleep(0.2)
            assert values == [expected], (key, values)
    finally:
        gateway.stop()
