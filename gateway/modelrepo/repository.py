"""Writing classifiers into a Triton model repository (`triton-gateway add-model` and
`remove-model`).

An image classifier is a user's ONNX network with the shipped pre- and postprocess code
(gateway.modelrepo.imageentry: the checks against the file and the four directories).

A fine-tuned text classifier is a user's ONNX network and tokenizer.json with the shipped
tokenize and postprocess code (gateway.modelrepo.textentry: the checks and the four
directories).

A zero-shot text classifier is a new label set on the shipped sentence encoder: its own ensemble
(``NAME``: text_tokenize -> text_model -> ``NAME_postprocess``), its own postprocess
(``NAME_postprocess``, the shipped ``text_postprocess`` code through a symlink, with the
label set written beside it) and its own label-listing model (``NAME_labels``). The
networks are shared, not copied; the configs are the shipped ones with the names changed,
so the GPU and CPU twins stay exactly as the shipped model's.

Nothing is half-written: every directory is written in a staging directory next to the
repository first and moved into place only when all of them are complete; a failure
while moving puts back what was there.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from gateway.errors import ConfigurationError
from gateway.modelrepo import imageentry, textentry
from gateway.modelrepo.imageentry import ImageModelError, ImageOptions
from gateway.modelrepo.labelfile import LabelFileError, read_class_labels, read_id2label, read_label_file
from gateway.modelrepo.onnxgraph import OnnxFileError, read_graph
from gateway.modelrepo.textentry import TextModelError, TextOptions
from gateway.modelrepo.tokenizerfile import TokenizerFileError, read_tokenizer
from gateway.names import SHIPPED_MODELS
from gateway.triton import pbtxt

# The shipped models a zero-shot text classifier is made from.
TEXT_TEMPLATE = SHIPPED_MODELS["text"]["ensemble"]
TEXT_POSTPROCESS = SHIPPED_MODELS["text"]["postprocess"]
TEXT_LABELS = SHIPPED_MODELS["text"]["labels"]
# Written into every ensemble this module adds: remove-model removes only those.
MANAGED_PARAMETER = "gateway_added_by"
# fullmatch only: re.match with "$" lets a trailing newline through ("foo\n")
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{0,63}")
# a step's name as add-model writes it: NAME_<part>
_STEP = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{0,127}")


class ModelRepositoryError(ConfigurationError):
    """The model cannot be added or removed as asked (the message says why); nothing changed."""


def _parts(name: str) -> dict[str, str]:
    return {"ensemble": name, "postprocess": f"{name}_postprocess", "labels": f"{name}_labels"}


def _check_name(repository: Path, name: str) -> None:
    if not NAME.fullmatch(name):
        raise ModelRepositoryError(
            f"{name!r} is not a model name: a letter, then letters, digits, _ or -, at most 64"
        )
    shipped = {model for models in SHIPPED_MODELS.values() for model in models.values()}
    own = {name, *_parts(name).values(), *imageentry.parts(name).values(), *textentry.parts(name).values()}
    if own & shipped:
        raise ModelRepositoryError(f"{name!r} would overwrite a shipped model")
    if not repository.is_dir():
        raise ModelRepositoryError(f"{repository} is not a model repository (no such directory)")


def _stage_text(repository: Path, name: str, labels: list[tuple[str, str]], staging: Path) -> None:
    import numpy as np  # only this command needs it here

    parts = _parts(name)
    for shipped in (TEXT_TEMPLATE, TEXT_POSTPROCESS, TEXT_LABELS):
        if not (repository / shipped / "config.pbtxt").is_file():
            raise ModelRepositoryError(
                f"{repository} has no {shipped}: add-model builds on the shipped models"
            )
    origin = f"Written by `triton-gateway add-model {name}`: a zero-shot label set on the shipped encoder."
    ensemble = staging / parts["ensemble"]
    (ensemble / "1").mkdir(parents=True)
    config = pbtxt.read_config(repository / TEXT_TEMPLATE / "config.pbtxt")
    config.name = name
    for step in config.ensemble_scheduling.step:
        if step.model_name == TEXT_POSTPROCESS:
            step.model_name = parts["postprocess"]
    pbtxt.set_parameter(config, "labels_model", parts["labels"])
    pbtxt.set_parameter(config, MANAGED_PARAMETER, "add-model")
    (ensemble / "config.pbtxt").write_text(pbtxt.render(config, origin))

    post = staging / parts["postprocess"]
    (post / "1").mkdir(parents=True)
    config = pbtxt.read_config(repository / TEXT_POSTPROCESS / "config.pbtxt")
    config.name = parts["postprocess"]
    (post / "config.pbtxt").write_text(pbtxt.render(config, origin))
    (post / "1" / "model.py").symlink_to(Path("..") / ".." / TEXT_POSTPROCESS / "1" / "model.py")
    with (post / "1" / "label_set.npz").open("wb") as out:
        np.savez(out, names=np.array([n for n, _ in labels]), prompts=np.array([p for _, p in labels]))

    listing = staging / parts["labels"]
    (listing / "1").mkdir(parents=True)
    config = pbtxt.read_config(repository / TEXT_LABELS / "config.pbtxt")
    config.name = parts["labels"]
    (listing / "config.pbtxt").write_text(pbtxt.render(config, origin))
    (listing / "1" / "model.py").symlink_to(Path("..") / ".." / TEXT_LABELS / "1" / "model.py")
    (listing / "1" / "label_set.npz").symlink_to(
        Path("..") / ".." / parts["postprocess"] / "1" / "label_set.npz"
    )


def _install(repository: Path, staging: Path, names: list[str]) -> None:
    """Move the staged directories into the repository; on failure, put back what was there."""
    moved: list[tuple[Path, Path | None]] = []  # (installed, the old one kept aside)
    try:
        for name in names:
            target = repository / name
            old = None
            if target.exists() or target.is_symlink():
                old = staging / f".old-{name}"
                target.rename(old)
            moved.append((target, old))
            (staging / name).rename(target)
    except OSError as exc:
        for target, old in reversed(moved):
            if target.exists():
                shutil.rmtree(target, ignore_errors=True)
            if old is not None:
                old.rename(target)
        raise ModelRepositoryError(f"cannot write into {repository}: {exc.strerror or exc}") from exc


def _managed_parts(repository: Path, name: str) -> list[str]:
    """The directories of ``name`` written by add-model: its ensemble, the steps named
    NAME_* it runs and its labels model; [] when ``name`` is not such a model."""
    config_path = repository / name / "config.pbtxt"
    if not config_path.is_file():
        return []
    config = pbtxt.read_config(config_path)
    values = pbtxt.parameters(config)
    if MANAGED_PARAMETER not in values:
        return []
    steps = [step.model_name for step in config.ensemble_scheduling.step]
    own = [model for model in [*steps, values.get("labels_model", "")] if _own_part(repository, name, model)]
    return [name, *dict.fromkeys(part for part in own if (repository / part).exists())]


def _own_part(repository: Path, name: str, part: str) -> bool:
    """Whether ``part`` (a name read from a config.pbtxt: a file's word, not ours) is one
    of ``name``'s own directories: NAME_<word> by full match, and a directory directly
    in the repository once resolved (``NAME_x/../../victim`` is neither)."""
    if not (_STEP.fullmatch(part) and part.startswith(f"{name}_")):
        return False
    root = repository.resolve()
    target = (repository / part).resolve()
    return target.parent == root and not (repository / part).is_symlink()


def _write(
    repository: Path, name: str, names: list[str], replace: bool, stage: Callable[[Path], None]
) -> None:
    """Stage ``names`` with ``stage`` next to the repository, then move them in; on
    --replace, the directories of the model's previous entry that the new one has no
    more are removed once the new one is in place."""
    existing = [n for n in names if (repository / n).exists()]
    if existing and not replace:
        raise ModelRepositoryError(
            f"{', '.join(existing)} already in {repository}: pass --replace to overwrite"
        )
    previous = _managed_parts(repository, name) if replace else []
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".add-model-{name}-", dir=repository.parent))
    except OSError as exc:
        raise ModelRepositoryError(f"cannot write next to {repository}: {exc.strerror or exc}") from exc
    try:
        stage(staging)
        _install(repository, staging, names)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for stale in set(previous) - set(names):
        shutil.rmtree(repository / stale, ignore_errors=True)


def add_text_classifier(
    repository: Path, name: str, labels_file: Path, *, replace: bool = False
) -> list[str]:
    """Write text classifier ``name`` (a label set on the shipped encoder) into the
    repository; returns the model directories written. Load ``name`` through /admin (or
    restart Triton) and the gateway's catalog serves it."""
    _check_name(repository, name)
    try:
        labels = read_label_file(labels_file)
    except LabelFileError as exc:
        raise ModelRepositoryError(str(exc)) from exc
    names = list(_parts(name).values())
    _write(repository, name, names, replace, lambda staging: _stage_text(repository, name, labels, staging))
    return names


def add_finetuned_text_classifier(
    repository: Path,
    name: str,
    onnx_file: Path,
    tokenizer_file: Path,
    labels_file: Path,
    options: TextOptions,
    *,
    labels_from_config: bool = False,
    replace: bool = False,
) -> list[str]:
    """Write text classifier ``name`` (the user's fine-tuned network and its tokenizer,
    with the shipped tokenize and postprocess code) into the repository, after checking
    the files, the labels and the options against each other; returns the directories
    written. ``labels_from_config``: ``labels_file`` is a config.json with id2label."""
    _check_name(repository, name)
    try:
        labels = read_id2label(labels_file) if labels_from_config else read_class_labels(labels_file)
        tokenizer = read_tokenizer(tokenizer_file)
        spec = textentry.text_spec(read_graph(onnx_file), tokenizer, labels, labels_file, options)
    except LabelFileError as exc:
        raise ModelRepositoryError(str(exc)) from exc
    except (OnnxFileError, TokenizerFileError, TextModelError) as exc:
        raise ModelRepositoryError(exc.detail) from exc
    names = list(textentry.parts(name).values())
    marker = (MANAGED_PARAMETER, "add-model")

    def stage(staging: Path) -> None:
        try:
            textentry.stage_text(repository, name, spec, onnx_file, tokenizer_file, labels, staging, marker)
        except TextModelError as exc:
            raise ModelRepositoryError(exc.detail) from exc

    _write(repository, name, names, replace, stage)
    return names


def add_image_classifier(
    repository: Path,
    name: str,
    onnx_file: Path,
    labels_file: Path,
    options: ImageOptions,
    *,
    replace: bool = False,
) -> list[str]:
    """Write image classifier ``name`` (the ONNX network with the shipped pre- and
    postprocess code) into the repository, after checking the file, the labels and the
    options against each other; returns the model directories written."""
    _check_name(repository, name)
    try:
        labels = read_class_labels(labels_file)
        spec = imageentry.image_spec(read_graph(onnx_file), labels, labels_file, options)
    except (LabelFileError, OnnxFileError, ImageModelError) as exc:
        raise ModelRepositoryError(str(exc) if isinstance(exc, LabelFileError) else exc.detail) from exc
    names = list(imageentry.parts(name).values())
    marker = (MANAGED_PARAMETER, "add-model")

    def stage(staging: Path) -> None:
        try:
            imageentry.stage_image(repository, name, spec, onnx_file, labels, staging, marker)
        except ImageModelError as exc:
            raise ModelRepositoryError(exc.detail) from exc

    _write(repository, name, names, replace, stage)
    return names


def remove_model(repository: Path, name: str) -> list[str]:
    """Remove a classifier written by add-model (its ensemble and own steps); shipped or
    hand-written models are refused. Unload it through /admin first."""
    _check_name(repository, name)
    if not (repository / name / "config.pbtxt").is_file():
        raise ModelRepositoryError(f"{repository} holds no model {name!r}")
    names = _managed_parts(repository, name)
    if not names:
        raise ModelRepositoryError(f"{name} was not written by add-model: remove it by hand")
    for part in names:
        if part != name and not _own_part(repository, name, part):  # checked again where it is used
            raise ModelRepositoryError(f"{name}'s configuration names {part!r}, which is not its own")
        shutil.rmtree(repository / part)
    return names
