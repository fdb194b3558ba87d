"""deploy/model-build/plans.py without a GPU: fake `trtexec` and `nvidia-smi` executables
answer as the real ones do; the stamp decides when a plan is rebuilt."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.support import load_script, tiny_classifier_onnx

ROOT = Path(__file__).resolve().parents[2]


plans = load_script(ROOT / "deploy" / "model-build" / "plans.py", "plans")


def fake_tools(folder: Path, tensorrt: int, gpus: list[str]) -> tuple[Path, Path, Path]:
    """trtexec prints its banner and writes --saveEngine; each call is logged as JSON."""
    calls = folder / "calls.jsonl"
    trtexec = folder / "trtexec"
    trtexec.write_text(
        f"""#!{sys.executable}
import json, sys
print("&&&& RUNNING TensorRT.trtexec [TensorRT v{tensorrt}] # trtexec")
with open({str(calls)!r}, "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
for arg in sys.argv[1:]:
    if arg.startswith("--saveEngine="):
        open(arg.split("=", 1)[1], "wb").write(b"plan")
"""
    )
    smi = folder / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in gpus))
    trtexec.chmod(0o755)
    smi.chmod(0o755)
    return trtexec, smi, calls


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    for name in ("image_model", "text_model"):
        (tmp_path / "repo" / name / "1").mkdir(parents=True)
        (tmp_path / "repo" / name / "1" / "model.onnx").write_bytes(name.encode())
        shutil.copyfile(
            ROOT / "model_repository" / name / "plan.json", tmp_path / "repo" / name / "plan.json"
        )
    return tmp_path / "repo"


def run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, repository: Path, tensorrt: int, gpus: list[str]
) -> list[list[str]]:
    tools = tmp_path / f"tools-{tensorrt}-{len(gpus)}-{gpus[0][:4]}"
    tools.mkdir(exist_ok=True)
    trtexec, smi, calls = fake_tools(tools, tensorrt, gpus)
    calls.unlink(missing_ok=True)  # this run's calls only
    monkeypatch.setenv("TRTEXEC", str(trtexec))
    monkeypatch.setenv("NVIDIA_SMI", str(smi))
    assert plans.main(["--repository", str(repository)]) == 0
    builds = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    return [args for args in builds if args != ["--help"]]


def test_plans_are_built_once_then_kept_while_nothing_changed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, repository: Path
) -> None:
    first = run(monkeypatch, tmp_path, repository, 101300, ["NVIDIA L4, 8.9"])
    assert len(first) == 2
    assert all("--fp16" in args for args in first)
    stamp = json.loads((repository / "text_model" / "1" / "model.plan.stamp").read_text())
    assert stamp["tensorrt"] == "10.13.0"
    assert stamp["gpu"] == {"name": "NVIDIA L4", "compute_capability": "8.9"}
    assert run(monkeypatch, tmp_path, repository, 101300, ["NVIDIA L4, 8.9"]) == []


@pytest.mark.parametrize(
    ("tensorrt", "gpus"),
    [
        (101400, ["NVIDIA L4, 8.9"]),  # another TensorRT release
        (101300, ["NVIDIA H100 80GB HBM3, 9.0"]),  # another GPU model
    ],
)
def test_a_plan_for_another_tensorrt_or_gpu_is_rebuilt(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, repository: Path, tensorrt: int, gpus: list[str]
) -> None:
    run(monkeypatch, tmp_path, repository, 101300, ["NVIDIA L4, 8.9"])
    assert len(run(monkeypatch, tmp_path, repository, tensorrt, gpus)) == 2


def test_a_changed_onnx_is_rebuilt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, repository: Path) -> None:
    run(monkeypatch, tmp_path, repository, 101300, ["NVIDIA L4, 8.9"])
    (repository / "image_model" / "1" / "model.onnx").write_bytes(b"new export")
    rebuilt = run(monkeypatch, tmp_path, repository, 101300, ["NVIDIA L4, 8.9"])
    assert len(rebuilt) == 1
    assert any("image_model" in arg for arg in rebuilt[0])


def test_mixed_gpu_models_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, repository: Path
) -> None:
    with pytest.raises(SystemExit, match="different models"):
        run(monkeypatch, tmp_path, repository, 101300, ["NVIDIA L4, 8.9", "Tesla T4, 7.5"])
    assert not (repository / "image_model" / "1" / "model.plan").exists()


def test_same_model_gpus_are_fine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, repository: Path) -> None:
    assert len(run(monkeypatch, tmp_path, repository, 101300, ["NVIDIA L4, 8.9", "NVIDIA L4, 8.9"])) == 2


def test_precision_flags_follow_the_tensorrt_release() -> None:
    assert plans.precision_flags((10, 13, 0), "fp16") == ["--fp16"]
    assert plans.precision_flags((11, 0, 0), "fp16") == ["--stronglyTyped"]  # --fp16 is gone in 11
    assert plans.precision_flags((11, 0, 0), "fp32") == []


def test_shapes_match_the_tokenizer_buckets_and_batch_sizes() -> None:
    (image, text) = plans.plan_specs(ROOT / "model_repository")
    assert text.max_shape == "64x256"
    assert text.shapes(text.opt_shape) == "input_ids:8x64,attention_mask:8x64"
    assert image.shapes(image.max_shape) == "input:32x3x224x224"


def test_a_model_written_by_add_model_gets_its_plan_with_its_own_profile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, repository: Path
) -> None:
    for name in ("image_classifier", "image_preprocess", "image_postprocess"):
        shutil.copytree(
            ROOT / "model_repository" / name, repository / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    for part in ("config.pbtxt", "configs", "1/model.py"):
        source = ROOT / "model_repository" / "image_model" / part
        copy = shutil.copytree if source.is_dir() else shutil.copyfile
        copy(source, repository / "image_model" / part)
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\nc\n")
    network = tiny_classifier_onnx(tmp_path / "net.onnx", (None, 3, 64, 48))
    added = subprocess.run(
        [sys.executable, "-m", "gateway", "add-model", "mine", "--task", "image-classification", "--onnx",
         str(network), "--labels", str(labels), "--normalize", "inception", "--max-batch", "16",
         "--repository", str(repository)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    builds = run(monkeypatch, tmp_path, repository, 101300, ["NVIDIA L4, 8.9"])
    assert len(builds) == 3
    (mine,) = [args for args in builds if any("mine_model" in arg for arg in args)]
    assert "--minShapes=pixels:1x3x64x48" in mine
    assert "--optShapes=pixels:8x3x64x48" in mine
    assert "--maxShapes=pixels:16x3x64x48" in mine
    assert (repository / "mine_model" / "1" / "model.plan").exists()
    # its ONNX replaced (add-model --replace with a new export): only its plan is rebuilt
    (repository / "mine_model" / "1" / "model.onnx").write_bytes(b"another export")
    rebuilt = run(monkeypatch, tmp_path, repository, 101300, ["NVIDIA L4, 8.9"])
    assert len(rebuilt) == 1
    assert any("mine_model" in arg for arg in rebuilt[0])


def test_a_repository_without_profiles_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="nothing to build"):
        run(monkeypatch, tmp_path, tmp_path / "empty", 101300, ["NVIDIA L4, 8.9"])


def test_a_fine_tuned_text_classifier_gets_a_plan_over_batch_and_sequence(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, repository: Path
) -> None:
    """The text entry's profile covers every token input over batch 1..max and sequence
    1..max-length, with the same shape for each input, as TensorRT needs."""
    from helpers.textmodels import text_onnx, tokenizer_file

    for name in ("text_classifier", "text_tokenize", "text_postprocess", "text_labels", "image_postprocess"):
        shutil.copytree(ROOT / "model_repository" / name, repository / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.npz", "tokenizer.json"), symlinks=True)  # fmt: skip
    for source_name in ("image_model", "text_model"):
        for part in ("config.pbtxt", "configs", "1/model.py"):
            source = ROOT / "model_repository" / source_name / part
            if (repository / source_name / part).exists():
                continue
            copy = shutil.copytree if source.is_dir() else shutil.copyfile
            copy(source, repository / source_name / part)
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\nc\n")
    added = subprocess.run(
        [sys.executable, "-m", "gateway", "add-model", "reviews", "--task", "text-classification",
         "--onnx", str(text_onnx(tmp_path / "net.onnx", positions=128)),
         "--tokenizer", str(tokenizer_file(tmp_path / "tokenizer.json")), "--labels", str(labels),
         "--max-batch", "32", "--max-length", "96", "--repository", str(repository)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    builds = run(monkeypatch, tmp_path, repository, 101300, ["NVIDIA L4, 8.9"])
    (reviews,) = [args for args in builds if any("reviews_model" in arg for arg in args)]
    tokens = ("input_ids", "attention_mask", "token_type_ids")
    assert "--minShapes=" + ",".join(f"{t}:1x1" for t in tokens) in reviews
    assert "--optShapes=" + ",".join(f"{t}:8x64" for t in tokens) in reviews
    assert "--maxShapes=" + ",".join(f"{t}:32x96" for t in tokens) in reviews
    assert (repository / "reviews_model" / "1" / "model.plan").exists()
