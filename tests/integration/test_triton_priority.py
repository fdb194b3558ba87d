"""Triton's own request priority carries a key's tier through our ensembles (triton#6055).

triton#6055 (Triton 23.05) reports an ensemble's priority lost on the steps after the
first. On Triton 2.51 (the wheel's and our images' release) it reaches every step: a key
of a tier above the standard one is sent at priority 1, and on a repository whose Python
steps declare two levels (as a user's own may: the shipped ones declare none, since levels
turn off Triton's prefetching, test_triton_batcher.py), Triton's verbose log shows those
steps' requests prepared at 1; a standard key's requests go at the default level. The
model step (text_model) declares no levels: the priority it is sent with is not an error
there. If a Triton release drops it again, this test fails (docs/explanation/reliability.md,
"Tiers and Triton's priority")."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import httpx

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer
from gateway.shared.keyfiles import hash_key

from helpers.triton_fixtures import REPOSITORY, _servers, triton_env

STEPS = ("text_tokenize", "text_postprocess")  # text_model declares no levels
LEVELS = "dynamic_batching {\n  priority_levels: 2\n  default_priority_level: 2\n"


def with_levels(repository: Path) -> Path:
    """The shipped repository (its files linked) with two priority levels declared on the
    text ensemble's Python steps."""
    shutil.copytree(REPOSITORY, repository, copy_function=os.symlink)
    for step in STEPS:
        config = repository / step / "config.pbtxt"
        text = config.read_text()
        assert "dynamic_batching {\n" in text, config
        config.unlink()
        config.write_text(text.replace("dynamic_batching {\n", LEVELS, 1))
    return repository


def prepared(log: str, request_id: str) -> dict[str, int]:
    """The priority Triton prepared each model's request of ``request_id`` with."""
    return {
        match.group(1): int(match.group(2))
        for match in re.finditer(rf"request id: {request_id}, model: (\w+),.*?priority: (\d+)", log)
    }


def test_a_gold_keys_priority_reaches_every_step_of_the_ensemble(
    tmp_path: Path, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    triton = TritonServer.on_free_ports(
        triton_env(),
        with_levels(tmp_path / "repository"),
        tmp_path / "triton",
        model_control_mode="explicit",
        load_models=("*",),
        log_verbose=1,
    )
    _servers.append(triton)
    triton.start()
    try:
        triton.wait_ready(timeout=180)
        keys = tmp_path / "keys"
        keys.write_text(f"gold {hash_key('gold-key')} tier=gold\nplain {hash_key('plain-key')}\n")
        gateway = spawn_gateway(
            triton,
            GATEWAY_AUTH__KEYS_FILE=str(keys),
            GATEWAY_TIERS='{"standard": {}, "gold": {"share": 4, "priority": 1}}',
        )
        for key, request_id in (("gold-key", "prioritygold"), ("plain-key", "priorityplain")):
            answer = httpx.post(
                f"{gateway.url}/classify",
                json={"text": "the film was a delight"},
                headers={"authorization": f"Bearer {key}", "x-request-id": request_id},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
        log = triton.log_file.read_text(errors="replace")
    finally:
        triton.kill()
        _servers.remove(triton)
    gold, plain = prepared(log, "prioritygold"), prepared(log, "priorityplain")
    print(f"gold: {gold}; standard: {plain}")
    assert "text_model" in gold, gold  # it ran, priority or not
    assert "text_model" in plain, plain
    assert set(STEPS) <= set(gold), gold
    assert all(gold[step] == 1 for step in ("text_classifier", *STEPS)), gold
    assert set(STEPS) <= set(plain), plain
    assert all(plain[step] != 1 for step in STEPS), plain  # the default level (2)
