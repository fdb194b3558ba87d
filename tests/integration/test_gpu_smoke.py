"""The GPU smoke command's non-GPU parts, against the real CPU stack: every check passes
with the committed CPU-twin reference, a wrong reference fails it, and its compose and
perf_analyzer commands name files and services that exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.support import ServedApp, load_script

ROOT = Path(__file__).resolve().parents[2]


smoke = load_script(ROOT / "deploy" / "gpu-smoke" / "smoke.py", "smoke")


def test_smoke_passes_on_the_cpu_stack(gateway: ServedApp, capsys: pytest.CaptureFixture[str]) -> None:
    assert smoke.main(["--url", gateway.url, "--ready-timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    for check in (
        "image",
        "text with candidate labels",
        "corrupt-EXIF image refused alone",
        "images: top-1 agrees",
        "catalog: image_classifier",
        "catalog: text_classifier",
    ):
        assert f"PASS  {check}" in out


def test_smoke_fails_when_answers_disagree_with_the_reference(
    gateway: ServedApp, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = json.loads((ROOT / "deploy" / "gpu-smoke" / "reference.json").read_text())
    reference["texts"][0] = ["entertainment", 0.9]  # a confident answer the stack does not give
    wrong = tmp_path / "reference.json"
    wrong.write_text(json.dumps(reference))
    assert smoke.main(["--url", gateway.url, "--reference", str(wrong)]) == 1
    assert "FAIL  texts: top-1 agrees with the CPU twin" in capsys.readouterr().out


@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_dry_run_names_real_compose_files(variant: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert smoke.main(["--compose", variant, "--perf", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    compose = next(line for line in lines if " compose " in line).split()
    files = [compose[i + 1] for i, part in enumerate(compose) if part == "-f"]
    assert files
    assert all(Path(name).exists() for name in files)
    perf = [line for line in lines if "perf_analyzer" in line]
    assert len(perf) == 2
    assert all("-u triton:8001" in line for line in perf)
    for model in ("image_classifier", "text_classifier"):
        assert (ROOT / "model_repository" / model / "config.pbtxt").exists()
