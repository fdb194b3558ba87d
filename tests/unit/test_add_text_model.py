"""`triton-gateway add-model --task text-classification --onnx --tokenizer`: the command's
own entry point (``gateway.__main__.main``, what the console script calls) on real, tiny
ONNX files and tokenizer files made here. What it writes, and every refusal naming the
file and the numbers, exiting non-zero and leaving the repository exactly as it was.
(Served by a real Triton, with real fine-tuned models: tests/integration/test_own_classifiers.py.)"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.__main__ import main
from gateway.triton import pbtxt

from helpers.repositories import shipped_copy, snapshot
from helpers.textmodels import text_onnx, tokenizer_file

SHIPPED = ("image_classifier", "image_preprocess", "image_model", "image_postprocess",
           "text_classifier", "text_tokenize", "text_model", "text_postprocess", "text_labels")  # fmt: skip


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """The shipped models' configs and code (what add-model builds on), no networks."""
    return shipped_copy(tmp_path / "models", SHIPPED)


def labels(tmp_path: Path, names: Sequence[str]) -> Path:
    path = tmp_path / f"labels-{len(names)}.txt"
    path.write_text("".join(f"{name}\n" for name in names))
    return path


def add(repository: Path, name: str, *options: str) -> int:
    return main(
        ["add-model", name, "--task", "text-classification", "--repository", str(repository), *options]
    )


def test_a_fine_tuned_text_classifier_is_written_with_the_shipped_code(
    repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    network = text_onnx(tmp_path / "net.onnx")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"id2label": {"0": "negative", "1": "neutral", "2": "positive"}}))
    code = add(repository, "reviews", "--onnx", str(network), "--tokenizer", str(tokenizer_file(tmp_path / "t.json")),
               "--labels-from", str(config), "--activation", "sigmoid")  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "reviews, reviews_tokenize, reviews_model, reviews_postprocess" in capsys.readouterr().out

    ensemble = pbtxt.read_config(repository / "reviews" / "config.pbtxt")
    assert pbtxt.parameters(ensemble)["gateway_task"] == "text-classification"
    assert "CANDIDATE_LABELS" not in [tensor.name for tensor in ensemble.input]
    steps = ensemble.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["reviews_tokenize", "reviews_model", "reviews_postprocess"]
    assert dict(steps[0].output_map) == {"INPUT_IDS": "input_ids", "ATTENTION_MASK": "attention_mask",
                                         "TOKEN_TYPE_IDS": "token_type_ids", "TRUNCATED": "TRUNCATED"}  # fmt: skip
    tokenize = pbtxt.read_config(repository / "reviews_tokenize" / "config.pbtxt")
    assert pbtxt.parameters(tokenize)["max_tokens"] == "32"  # the position embeddings' rows
    assert pbtxt.parameters(tokenize)["length_buckets"] == ""  # 64 and 128 are over 32
    assert (repository / "reviews_tokenize" / "1" / "tokenizer.json").is_file()
    for part, shipped in (
        ("tokenize", "text_tokenize"),
        ("model", "image_model"),
        ("postprocess", "image_postprocess"),
    ):
        code_file = repository / f"reviews_{part}" / "1" / "model.py"
        assert code_file.is_symlink()
        assert code_file.resolve() == (repository / shipped / "1" / "model.py").resolve()
    post = pbtxt.read_config(repository / "reviews_postprocess" / "config.pbtxt")
    assert pbtxt.parameters(post)["activation"] == "sigmoid"
    assert (repository / "reviews_postprocess" / "labels.txt").read_text().split() == [
        "negative",
        "neutral",
        "positive",
    ]
    gpu = pbtxt.read_config(repository / "reviews_model" / "config.pbtxt")
    cpu = pbtxt.read_config(repository / "reviews_model" / "configs" / "cpu.pbtxt")
    assert gpu.platform == "tensorrt_plan"
    assert cpu.backend == "python"
    for config_ in (gpu, cpu):
        assert [t.name for t in config_.input] == ["input_ids", "attention_mask", "token_type_ids"]
        assert [list(t.dims) for t in config_.output] == [[3]]
    assert json.loads((repository / "reviews_model" / "plan.json").read_text()) == {
        "inputs": ["input_ids", "attention_mask", "token_type_ids"],
        "min_shape": "1x1",
        "opt_shape": "8x32",
        "max_shape": "64x32",
    }


def test_int32_inputs_without_token_types_and_a_fixed_sequence_length(
    repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    network = text_onnx(tmp_path / "net.onnx", ("input_ids", "attention_mask"), element="INT32", sequence=16)
    code = add(repository, "fixed", "--onnx", str(network), "--tokenizer", str(tokenizer_file(tmp_path / "t.json")),
               "--labels", str(labels(tmp_path, ["a", "b", "c"])))  # fmt: skip
    assert code == 0, capsys.readouterr().err
    tokenize = pbtxt.read_config(repository / "fixed_tokenize" / "config.pbtxt")
    assert {t.name: pbtxt.data_type("TYPE_INT32") == t.data_type for t in tokenize.output if t.name != "TRUNCATED"} == {
        "INPUT_IDS": True, "ATTENTION_MASK": True,
    }  # fmt: skip
    assert [list(t.dims) for t in tokenize.output if t.name == "INPUT_IDS"] == [[16]]
    assert pbtxt.parameters(tokenize)["length_buckets"] == "16"  # every text padded to the fixed length
    profile = json.loads((repository / "fixed_model" / "plan.json").read_text())
    assert (profile["min_shape"], profile["max_shape"]) == ("1x16", "64x16")


def _refused(repository: Path, capsys: pytest.CaptureFixture[str], *arguments: str) -> str:
    before = snapshot(repository)
    code = add(repository, "refused", *arguments)
    assert code == 1
    assert snapshot(repository) == before
    assert not list(repository.parent.glob(".add-model-*"))
    error = capsys.readouterr().err
    assert "Traceback" not in error
    return error


@pytest.mark.parametrize(
    ("network", "extra", "message"),
    [
        ({"inputs": ("pixels", "attention_mask")}, (), "unknown: pixels"),
        ({"inputs": ("input_ids",)}, (), "missing: attention_mask"),
        ({"element": "FLOAT"}, (), "must all be INT64 or all INT32"),
        ({"types": {"attention_mask": "INT32"}}, (), "must all be INT64 or all INT32"),
        ({"batch": 4}, (), "batch axis is fixed at 4"),
        ({"output_dims": ["batch", 3, 1]}, (), "a classifier's output is batch x classes"),
        ({"outputs": 2}, (), "name one with --output"),
        ({"classes": 4}, (), "has 3 labels, but"),
        ({"vocabulary": 8}, (), "the tokenizer is not this model's"),
        ({"positions": 32}, ("--max-length", "64"), "longer than"),
        ({"sequence": 16}, ("--max-length", "32"), "fixed at 16, --max-length says 32"),
        ({}, ("--max-top-k", "9"), "--max-top-k must be 1..3"),
    ],
    ids=[
        "unknown-input",
        "missing-mask",
        "float-inputs",
        "mixed-integers",
        "fixed-batch",
        "rank-3-output",
        "two-outputs",
        "classes-vs-labels",
        "vocabulary",
        "max-length-vs-positions",
        "fixed-sequence",
        "top-k",
    ],
)
def test_a_network_that_does_not_fit_is_refused_by_name_and_number(
    repository: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    network: dict[str, object],
    extra: tuple[str, ...],
    message: str,
) -> None:
    onnx_file = text_onnx(tmp_path / "net.onnx", **network)  # type: ignore[arg-type]
    error = _refused(repository, capsys, "--onnx", str(onnx_file), "--tokenizer", str(tokenizer_file(tmp_path / "t.json")),
                     "--labels", str(labels(tmp_path, ["a", "b", "c"])), *extra)  # fmt: skip
    assert message in error
    assert "net.onnx" in error or "labels" in error or "--max-top-k" in error


def test_files_and_options_that_do_not_fit_are_refused(
    repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    network, tokens = str(text_onnx(tmp_path / "net.onnx")), str(tokenizer_file(tmp_path / "t.json"))
    three = str(labels(tmp_path, ["a", "b", "c"]))
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": {"type": "Nonsense"}}')
    assert "not a Hugging Face tokenizer.json" in _refused(
        repository, capsys, "--onnx", network, "--tokenizer", str(broken), "--labels", three
    )
    assert "needs its tokenizer" in _refused(repository, capsys, "--onnx", network, "--labels", three)
    assert "for your own network (--onnx) only" in _refused(
        repository, capsys, "--tokenizer", tokens, "--labels", three
    )
    assert "--activation: for your own network" in _refused(
        repository, capsys, "--labels", three, "--activation", "sigmoid"
    )
    repeated = tmp_path / "repeated.txt"
    repeated.write_text("a\nb\na\n")
    assert "listed twice" in _refused(
        repository, capsys, "--onnx", network, "--tokenizer", tokens, "--labels", str(repeated)
    )
    no_labels = tmp_path / "config.json"
    no_labels.write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    assert "has no id2label" in _refused(
        repository, capsys, "--onnx", network, "--tokenizer", tokens, "--labels-from", str(no_labels)
    )
    gaps = tmp_path / "gaps.json"
    gaps.write_text(json.dumps({"id2label": {"0": "a", "2": "c", "3": "d"}}))
    assert "ids must be 0..2" in _refused(
        repository, capsys, "--onnx", network, "--tokenizer", tokens, "--labels-from", str(gaps)
    )
    image = main(["add-model", "img", "--task", "image-classification", "--repository", str(repository),
                  "--onnx", network, "--labels", three, "--max-length", "8"])  # fmt: skip
    assert image == 1
    assert "--max-length: for fine-tuned text classifiers only" in capsys.readouterr().err


def test_an_unknown_activation_is_refused_before_anything_runs(
    repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        add(repository, "x", "--onnx", "net.onnx", "--labels", "l.txt", "--activation", "softplus")
    assert exit_.value.code == 2
    assert "invalid choice: 'softplus'" in capsys.readouterr().err
