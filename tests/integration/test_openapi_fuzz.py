"""The API fuzzed from its own OpenAPI document (schemathesis) against the real stack:
valid and invalid requests for every operation; no 5xx, and every answer matches the
documented status codes, content types, headers and schemas.

It drives schemathesis's own CLI (its pytest plugin's `from_fixture` does not work with
pytest 9), with a fixed budget of examples per operation and a fixed seed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gateway.app import create_app
from gateway.dev.tritonserver import TritonServer
from gateway.settings import AuthSettings
from gateway.shared.keyfiles import hash_key

from helpers.support import ServedApp
from helpers.triton_fixtures import gateway_settings

KEY = "schemathesis-key"

# per operation, positive and negative generation together: a fixed budget (200 took 70 s
# of the suite, 120 took 40 s, 80 took 35-51 s)
EXAMPLES = 50
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
]


def test_every_operation_conforms_to_its_document(triton: TritonServer, tmp_path: Path) -> None:
    """With API keys on (as every deployment runs): the client presents a valid key."""
    keys = tmp_path / "keys"
    keys.write_text(f"fuzzer {hash_key(KEY)}\n")
    settings = gateway_settings(triton, auth=AuthSettings(keys_file=keys, metrics_readers=["fuzzer"]))
    gateway = ServedApp(create_app(settings), settings).start()
    try:
        run_schemathesis(gateway, tmp_path)
    finally:
        gateway.stop()


def run_schemathesis(gateway: ServedApp, tmp_path: Path) -> None:
    report = tmp_path / "schemathesis.ndjson"
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("schemathesis")),
            "--config-file", str(Path(__file__).parents[1] / "schemathesis.toml"),
            "run",
            f"{gateway.url}/openapi.json",
            "--checks", ",".join(CHECKS),
            "--mode", "all",
            "--max-examples", str(EXAMPLES),
            "--seed", "20261123",
            "--workers", "1",
            "--header", f"Authorization: Bearer {KEY}",
            "--request-timeout", "30",
            "--generation-database", "none",
            "--report", "ndjson",
            "--report-ndjson-path", str(report),
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # its crash cache (.schemathesis/) stays out of the checkout
    )  # fmt: skip
    output = result.stdout + result.stderr
    print(output[-3000:])
    assert result.returncode == 0, output[-6000:]
    events = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    assert len(events) > 10, "schemathesis ran no test cases"  # it really exercised the API
