"""add-model and remove-model as processes of their own (the console script's module), and
a repository made immutable with chattr (root): the parts of tests/unit/test_modelrepo.py
that need the operating system."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.modelrepo.repository import ModelRepositoryError, add_text_classifier
from gateway.triton import pbtxt

from helpers.repositories import TEXT_MODELS, labels, shipped_copy, snapshot


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    return shipped_copy(tmp_path / "models", TEXT_MODELS)


def test_the_command_line(repository: Path, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True)

    added = run("add-model", "tickets", "--task", "text-classification", "--labels", str(labels(tmp_path, "billing\nbugs\n")),
                "--repository", str(repository))  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "POST /admin/models/tickets/load" in added.stdout
    again = run("add-model", "tickets", "--task", "text-classification", "--labels", str(tmp_path / "labels.txt"),
                "--repository", str(repository))  # fmt: skip
    assert again.returncode == 1
    assert "--replace" in again.stderr
    assert "Traceback" not in again.stderr
    removed = run("remove-model", "tickets", "--repository", str(repository))
    assert removed.returncode == 0, removed.stderr
    assert not (repository / "tickets").exists()


def test_a_repository_that_is_not_writable_is_refused_and_left_as_it_was(
    repository: Path, tmp_path: Path
) -> None:
    """Root writes through file modes, so the directory is made immutable (ext4 chattr)."""
    before = snapshot(repository)
    subprocess.run(["chattr", "+i", str(repository)], check=True)
    try:
        with pytest.raises(ModelRepositoryError, match="cannot write into"):
            add_text_classifier(repository, "sentiment", labels(tmp_path, "a\nb\n"))
    finally:
        subprocess.run(["chattr", "-i", str(repository)], check=True)
    assert snapshot(repository) == before
    assert not list(tmp_path.glob(".add-model-*"))


def test_a_reference_file_is_checked_first_and_carried_by_the_models_configuration(
    repository: Path, tmp_path: Path
) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"label": "billing", "score": 0.9}\n{"label": "bugs", "score": 1.7}\n')
    refused = run("add-model", "tickets", "--task", "text-classification", "--labels", str(labels(tmp_path, "billing\nbugs\n")),
                  "--repository", str(repository), "--reference", str(bad))  # fmt: skip
    assert refused.returncode == 1
    assert f"{bad}:2" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (repository / "tickets").exists()  # nothing written

    good = tmp_path / "good.jsonl"
    good.write_text(
        "".join(
            f'{{"label": "{"billing" if i % 3 else "bugs"}", "score": 0.{i % 9 + 1}}}\n' for i in range(30)
        )
    )
    added = run("add-model", "tickets", "--task", "text-classification", "--labels", str(tmp_path / "labels.txt"),
                "--repository", str(repository), "--reference", str(good))  # fmt: skip
    assert added.returncode == 0, added.stderr
    config = pbtxt.read_config(repository / "tickets" / "config.pbtxt")
    reference = json.loads(pbtxt.parameters(config)["gateway_reference"])
    assert reference["labels"] == {"billing": 20, "bugs": 10}
    assert sum(reference["scores"]) == 30
    assert reference["source"] == "model-config"
    # what add-model wrote before it still stands, header comment included
    assert pbtxt.parameters(config)["gateway_task"] == "text-classification"
    assert (repository / "tickets" / "config.pbtxt").read_text().startswith("#")
