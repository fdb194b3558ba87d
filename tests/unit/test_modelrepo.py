"""add-model / remove-model on a model repository: what is written, and every refusal
leaving the repository exactly as it was. (Served by a real Triton:
tests/integration/test_catalog_stack.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from gateway.modelrepo.reference import ReferenceFileError, read_reference
from gateway.modelrepo.repository import ModelRepositoryError, add_text_classifier, remove_model
from gateway.observe.drift import Reference, score_bin
from gateway.triton import pbtxt

from helpers.repositories import TEXT_MODELS, labels, shipped_copy, snapshot


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """The shipped text models' configs and code (what add-model builds on)."""
    return shipped_copy(tmp_path / "models", TEXT_MODELS)


def test_a_text_classifier_is_written_sharing_the_shipped_code(repository: Path, tmp_path: Path) -> None:
    written = add_text_classifier(
        repository, "sentiment", labels(tmp_path, "positive: I am happy.\nnegative\n")
    )
    assert written == ["sentiment", "sentiment_postprocess", "sentiment_labels"]
    config = pbtxt.read_config(repository / "sentiment" / "config.pbtxt")
    assert config.name == "sentiment"
    assert pbtxt.parameters(config)["gateway_task"] == "text-classification"
    assert pbtxt.parameters(config)["labels_model"] == "sentiment_labels"
    steps = [step.model_name for step in config.ensemble_scheduling.step]
    assert steps == ["text_tokenize", "text_model", "sentiment_postprocess"]
    for part in ("sentiment_postprocess", "sentiment_labels"):
        assert pbtxt.read_config(repository / part / "config.pbtxt").name == part
    code = repository / "sentiment_postprocess" / "1" / "model.py"
    assert code.is_symlink()
    assert code.resolve() == (repository / "text_postprocess" / "1" / "model.py").resolve()
    with np.load(repository / "sentiment_labels" / "1" / "label_set.npz") as stored:
        assert stored["names"].tolist() == ["positive", "negative"]
        assert stored["prompts"].tolist() == ["I am happy.", "This text is about negative."]
    assert not list(tmp_path.glob(".add-model-*"))  # no staging left behind


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("only\n", "at least two labels"),
        ("a\nb\na\n", "listed twice"),
        (": a prompt\nb\n", "needs a name"),
    ],
)
def test_a_bad_label_file_writes_nothing(repository: Path, tmp_path: Path, text: str, message: str) -> None:
    before = snapshot(repository)
    with pytest.raises(ModelRepositoryError, match=message):
        add_text_classifier(repository, "sentiment", labels(tmp_path, text))
    assert snapshot(repository) == before


def test_an_existing_name_is_refused_unless_replace(repository: Path, tmp_path: Path) -> None:
    add_text_classifier(repository, "sentiment", labels(tmp_path, "a\nb\n"))
    before = snapshot(repository)
    with pytest.raises(ModelRepositoryError, match="--replace"):
        add_text_classifier(repository, "sentiment", labels(tmp_path, "c\nd\n"))
    assert snapshot(repository) == before
    add_text_classifier(repository, "sentiment", labels(tmp_path, "c\nd\n"), replace=True)
    with np.load(repository / "sentiment_postprocess" / "1" / "label_set.npz") as stored:
        assert stored["names"].tolist() == ["c", "d"]


@pytest.mark.parametrize("name", ["text_classifier", "text", "../x", "9lives", "a b"])
def test_bad_or_shipped_names_are_refused(repository: Path, tmp_path: Path, name: str) -> None:
    before = snapshot(repository)
    with pytest.raises(ModelRepositoryError):
        add_text_classifier(repository, name, labels(tmp_path, "a\nb\n"))
    assert snapshot(repository) == before


def test_remove_takes_out_only_what_add_model_wrote(repository: Path, tmp_path: Path) -> None:
    add_text_classifier(repository, "sentiment", labels(tmp_path, "a\nb\n"))
    assert remove_model(repository, "sentiment") == ["sentiment", "sentiment_postprocess", "sentiment_labels"]
    assert sorted(p.name for p in repository.iterdir()) == sorted(TEXT_MODELS)
    hand_made = repository / "hand_made"
    hand_made.mkdir()
    (hand_made / "config.pbtxt").write_text('name: "hand_made"\n')
    for name in ("hand_made", "text_classifier"):
        with pytest.raises(ModelRepositoryError):
            remove_model(repository, name)
    assert hand_made.exists()
    assert (repository / "text_classifier").exists()


def test_names_from_a_config_cannot_steer_a_delete(tmp_path: Path) -> None:
    """A config.pbtxt naming `NAME_postprocess/../../victim` as a step (a file's word, not ours):
    remove-model removes the model's own directories and nothing outside the repository."""
    repository = tmp_path / "repo"
    (repository / "mine" / "1").mkdir(parents=True)
    (repository / "mine_postprocess").mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    (repository / "mine" / "config.pbtxt").write_text(
        'name: "mine"\nplatform: "ensemble"\n'
        'parameters { key: "gateway_added_by" value { string_value: "add-model" } }\n'
        'ensemble_scheduling { step { model_name: "mine_postprocess/../../victim" model_version: -1 } '
        'step { model_name: "mine_postprocess" model_version: -1 } }\n'
    )
    removed = remove_model(repository, "mine")
    assert removed == ["mine", "mine_postprocess"]
    assert (victim / "keep.txt").read_text() == "precious"


def test_a_name_with_a_trailing_newline_is_not_a_name(tmp_path: Path) -> None:
    tmp_path.joinpath("repo").mkdir()
    with pytest.raises(ModelRepositoryError, match="not a model name"):
        remove_model(tmp_path / "repo", "foo\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "0 predictions"),
        ('{"label": "a", "score": 0.5}\n' * 3, "3 predictions"),
        ("not json\n", ":1: not JSON"),
        ('{"label": "", "score": 0.5}\n', "'label'"),
        ('{"label": "a", "score": NaN}\n', "'score' must be a number"),
        ('{"label": "a", "score": true}\n', "'score' must be a number"),
        ('{"label": "a", "score": -0.1}\n', "between 0 and 1"),
        ('{"results": [{"predictions": []}]}\n', "'predictions'"),
        ('{"results": {}}\n', "'results' must be a list"),
        ("[1, 2]\n", "expected"),
    ],
)
def test_a_predictions_file_that_makes_no_reference_is_refused_with_its_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "predictions.jsonl"
    path.write_text(text)
    with pytest.raises(ReferenceFileError, match=re.escape(message)):
        read_reference(path)


def test_a_reference_counts_top1_labels_and_scores_from_either_line_form(tmp_path: Path) -> None:
    path = tmp_path / "predictions.jsonl"
    answer = {
        "results": [{"predictions": [{"label": "cat", "score": 0.8}, {"label": "dog", "score": 0.1}]}] * 6
    }
    path.write_text(json.dumps(answer) + "\n\n" + '{"label": "dog", "score": 0.3}\n' * 5)
    document = json.loads(read_reference(path))
    assert document["labels"] == {"cat": 6, "dog": 5}
    assert document["scores"][score_bin(0.8)] == 6
    assert document["scores"][score_bin(0.3)] == 5
    assert Reference.from_json(document).distribution.inputs == 11
