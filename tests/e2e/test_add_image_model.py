"""`triton-gateway add-model --task image-classification`: the real command on real (tiny)
ONNX files. What it writes, and every refusal naming the file and the numbers and
leaving the repository exactly as it was. (Served by a real Triton, with EfficientNet-
Lite2 too: tests/integration/test_catalog_stack.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.triton import pbtxt

from helpers.repositories import shipped_copy, snapshot
from helpers.support import tiny_classifier_onnx

SHIPPED = ("image_classifier", "image_preprocess", "image_model", "image_postprocess",
           "text_classifier", "text_postprocess", "text_labels")  # fmt: skip


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """The shipped models' configs and code (what add-model builds on), no networks."""
    return shipped_copy(tmp_path / "models", SHIPPED)


def add_model(repository: Path, name: str, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gateway", "add-model", name, "--task", "image-classification",
               "--repository", str(repository), *options]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, check=False)


def labels(tmp_path: Path, names: Sequence[str]) -> Path:
    path = tmp_path / f"labels-{len(names)}.txt"
    path.write_text("".join(f"{name}\n" for name in names))
    return path


def test_an_image_classifier_is_written_from_the_onnx_file_with_the_shipped_code(
    repository: Path, tmp_path: Path
) -> None:
    network = tiny_classifier_onnx(tmp_path / "net.onnx", (None, 3, 96, 128), classes=5)
    added = add_model(repository, "tiny", "--onnx", str(network), "--labels",
                      str(labels(tmp_path, "abcde")), "--normalize", "imagenet", "--max-batch", "4")  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "tiny, tiny_preprocess, tiny_model, tiny_postprocess" in added.stdout

    ensemble = pbtxt.read_config(repository / "tiny" / "config.pbtxt")
    assert pbtxt.parameters(ensemble)["gateway_task"] == "image-classification"
    assert ensemble.max_batch_size == 4
    steps = ensemble.ensemble_scheduling.step
    assert [step.model_name for step in steps] == ["tiny_preprocess", "tiny_model", "tiny_postprocess"]
    assert dict(steps[1].input_map) == {"pixels": "pixels"}  # the ONNX input's name
    assert dict(steps[1].output_map) == {"logits": "logits"}

    pre = pbtxt.read_config(repository / "tiny_preprocess" / "config.pbtxt")
    assert list(pre.output[0].dims) == [3, 96, 128]
    params = pbtxt.parameters(pre)
    assert params["resize_short_side"] == "160"  # the longer side + 32
    assert params["mean"] == "123.675,116.28,103.53"
    assert params["std"] == "58.395,57.12,57.375"
    assert (params["layout"], params["channel_order"]) == ("NCHW", "RGB")
    assert params["formats"] == "JPEG,PNG,WEBP"  # carried over from the shipped preprocess

    gpu = pbtxt.read_config(repository / "tiny_model" / "config.pbtxt")
    cpu = pbtxt.read_config(repository / "tiny_model" / "configs" / "cpu.pbtxt")
    assert gpu.platform == "tensorrt_plan"
    assert cpu.backend == "python"
    for config in (gpu, cpu):
        assert config.name == "tiny_model"
        assert (config.input[0].name, list(config.input[0].dims)) == ("pixels", [3, 96, 128])
        assert (config.output[0].name, list(config.output[0].dims)) == ("logits", [5])
        assert config.max_batch_size == 4
    assert list(gpu.dynamic_batching.preferred_batch_size) == []  # 8, 16, 32 are all over 4
    assert json.loads((repository / "tiny_model" / "plan.json").read_text()) == {
        "inputs": ["pixels"],
        "min_shape": "1x3x96x128",
        "opt_shape": "4x3x96x128",
        "max_shape": "4x3x96x128",
    }
    assert (repository / "tiny_model" / "1" / "model.onnx").read_bytes() == network.read_bytes()

    post = pbtxt.read_config(repository / "tiny_postprocess" / "config.pbtxt")
    assert list(post.input[0].dims) == [5]
    assert pbtxt.parameters(post)["max_top_k"] == "5"
    assert (repository / "tiny_postprocess" / "labels.txt").read_text() == "a\nb\nc\nd\ne\n"
    for part, shipped in (("preprocess", "image_preprocess"), ("model", "image_model"),
                          ("postprocess", "image_postprocess")):  # fmt: skip
        code = repository / f"tiny_{part}" / "1" / "model.py"
        assert code.is_symlink(), "no Python is copied per model"
        assert code.resolve() == (repository / shipped / "1" / "model.py").resolve()
    assert not list(tmp_path.glob(".add-model-*"))


def test_channels_last_bgr_and_a_dynamic_size_given_on_the_command_line(
    repository: Path, tmp_path: Path
) -> None:
    network = tiny_classifier_onnx(tmp_path / "net.onnx", (None, None, None, 3))
    added = add_model(repository, "nhwc", "--onnx", str(network), "--labels", str(labels(tmp_path, "bgr")),
                      "--normalize", "imagenet", "--channel-order", "BGR", "--input-size", "40x48")  # fmt: skip
    assert added.returncode == 0, added.stderr
    pre = pbtxt.read_config(repository / "nhwc_preprocess" / "config.pbtxt")
    assert list(pre.output[0].dims) == [40, 48, 3]
    params = pbtxt.parameters(pre)
    assert (params["layout"], params["channel_order"]) == ("NHWC", "BGR")
    assert params["mean"] == "103.53,116.28,123.675"  # the preset in the network's (BGR) order
    plan = json.loads((repository / "nhwc_model" / "plan.json").read_text())
    assert plan["max_shape"] == "32x40x48x3"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("wrong label count", ["labels-4.txt has 4 labels", "net.onnx's output logits has 3 classes"]),
        ("two image inputs", ["net.onnx has 2 inputs", "pixels (? x 3 x 8 x 8)", "pixels1"]),
        (
            "dynamic spatial size",
            ["net.onnx: input pixels has a dynamic spatial size (? x 3 x ? x ?)", "--input-size"],
        ),
        ("unreadable onnx", ["net.onnx: not a valid ONNX model"]),
        ("not an image", ["net.onnx: input pixels is ? x 3 x 8, not an image"]),
        ("fixed batch of 8", ["net.onnx: input pixels's batch axis is fixed at 8"]),
        ("size given against a fixed one", ["fixed at 8x8, --input-size says 16x16"]),
        ("no normalisation", ["--normalize", "--mean and --std"]),
        ("duplicate label", ["labels-3.txt:3: label 'a' is listed twice (line 1)"]),
        ("missing onnx file", ["missing.onnx: no such file"]),
    ],
)
def test_a_refusal_names_the_file_and_the_numbers_and_writes_nothing(
    repository: Path, tmp_path: Path, case: str, expected: list[str]
) -> None:
    network = tmp_path / "net.onnx"
    options = ["--normalize", "inception"]
    names = ["a", "b", "c"]
    if case == "wrong label count":
        tiny_classifier_onnx(network)
        names = ["a", "b", "c", "d"]
    elif case == "two image inputs":
        tiny_classifier_onnx(network, inputs=2)
    elif case == "dynamic spatial size":
        tiny_classifier_onnx(network, (None, 3, None, None))
    elif case == "unreadable onnx":
        network.write_bytes(b"\x08\x07garbage, not a protobuf of a model" * 10)
    elif case == "not an image":
        tiny_classifier_onnx(network, (None, 3, 8))
    elif case == "fixed batch of 8":
        tiny_classifier_onnx(network, (8, 3, 8, 8))
    elif case == "size given against a fixed one":
        tiny_classifier_onnx(network)
        options += ["--input-size", "16x16"]
    elif case == "no normalisation":
        tiny_classifier_onnx(network)
        options = []
    elif case == "duplicate label":
        tiny_classifier_onnx(network)
        names = ["a", "b", "a"]
    elif case == "missing onnx file":
        network = tmp_path / "missing.onnx"
    before = snapshot(repository)
    refused = add_model(
        repository, "mine", "--onnx", str(network), "--labels", str(labels(tmp_path, names)), *options
    )
    assert refused.returncode == 1, refused.stdout
    assert "Traceback" not in refused.stderr
    for part in expected:
        assert part in refused.stderr, refused.stderr
    assert snapshot(repository) == before
    assert not list(tmp_path.glob(".add-model-*"))


def test_an_existing_name_is_refused_unless_replace_and_a_replaced_kind_leaves_nothing_behind(
    repository: Path, tmp_path: Path
) -> None:
    text_labels = tmp_path / "topics.txt"
    text_labels.write_text("cats\ndogs\n")
    command = [sys.executable, "-m", "gateway", "add-model", "pets", "--task", "text-classification",
               "--labels", str(text_labels), "--repository", str(repository)]  # fmt: skip
    assert subprocess.run(command, capture_output=True, check=False).returncode == 0
    network = tiny_classifier_onnx(tmp_path / "net.onnx")
    image = ["--onnx", str(network), "--labels", str(labels(tmp_path, "abc")), "--normalize", "inception"]
    before = snapshot(repository)
    refused = add_model(repository, "pets", *image)
    assert refused.returncode == 1
    assert "pets, pets_postprocess already in" in refused.stderr
    assert "--replace" in refused.stderr
    assert snapshot(repository) == before
    replaced = add_model(repository, "pets", *image, "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert pbtxt.parameters(pbtxt.read_config(repository / "pets" / "config.pbtxt"))["gateway_task"] == (
        "image-classification"
    )
    assert not (repository / "pets_labels").exists()  # the text entry's own step is gone
    removed = subprocess.run(
        [sys.executable, "-m", "gateway", "remove-model", "pets", "--repository", str(repository)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    assert sorted(p.name for p in repository.iterdir()) == sorted(SHIPPED)


def test_a_repository_that_is_not_writable_is_refused_and_left_as_it_was(
    repository: Path, tmp_path: Path
) -> None:
    """Root writes through file modes, so the directory is made immutable (ext4 chattr)."""
    network = tiny_classifier_onnx(tmp_path / "net.onnx")
    before = snapshot(repository)
    subprocess.run(["chattr", "+i", str(repository)], check=True)
    try:
        refused = add_model(repository, "mine", "--onnx", str(network), "--labels",
                            str(labels(tmp_path, "abc")), "--normalize", "inception")  # fmt: skip
    finally:
        subprocess.run(["chattr", "-i", str(repository)], check=True)
    assert refused.returncode == 1
    assert "cannot write into" in refused.stderr
    assert snapshot(repository) == before
    assert not list(tmp_path.glob(".add-model-*"))
