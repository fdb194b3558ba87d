"""Tiny real text classifiers: an ONNX network and a tokenizer.json made here, for
add-model's tests and the TensorRT plan tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

WORDS = ["good", "bad", "fine", "the", "service", "was", "very", "not"]


def tokenizer_file(path: Path, extra: int = 0) -> Path:
    """A real WordPiece tokenizer.json: [PAD] [UNK] [CLS] [SEP], the words, ``extra`` more."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    vocab.update({f"extra{i}": len(vocab) for i in range(extra)})
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.save(str(path))
    return path


def text_onnx(
    path: Path,
    inputs: Sequence[str] = ("input_ids", "attention_mask", "token_type_ids"),
    *,
    element: str = "INT64",
    batch: int | None = None,
    sequence: int | None = None,
    classes: int = 3,
    vocabulary: int = 12,
    positions: int = 32,
    outputs: int = 1,
    output_dims: Sequence[int | str] | None = None,
    types: dict[str, str] | None = None,
) -> Path:
    """A real (tiny) ONNX text classifier: the mean of its token embeddings times a matrix.
    Its embedding tables are named as Hugging Face exports name them."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    batch_dim: int | str = batch if batch is not None else "batch"
    sequence_dim: int | str = sequence if sequence is not None else "sequence"
    graph_inputs = [
        helper.make_tensor_value_info(
            name, getattr(TensorProto, (types or {}).get(name, element)), [batch_dim, sequence_dim]
        )
        for name in inputs
    ]
    first = inputs[0]
    initializers = [
        helper.make_tensor("bert.embeddings.word_embeddings.weight", TensorProto.FLOAT, [vocabulary, 4],
                           rng.normal(size=vocabulary * 4).astype(np.float32)),
        helper.make_tensor("bert.embeddings.position_embeddings.weight", TensorProto.FLOAT, [positions, 4],
                           np.zeros(positions * 4, dtype=np.float32)),
        helper.make_tensor("head", TensorProto.FLOAT, [4, classes], rng.normal(size=4 * classes).astype(np.float32)),
    ]  # fmt: skip
    nodes = [
        helper.make_node("Gather", ["bert.embeddings.word_embeddings.weight", first], ["embedded"]),
        helper.make_node("ReduceMean", ["embedded"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "head"], ["logits"]),
    ]
    graph_outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, list(output_dims or [batch_dim, classes]))
    ]
    for extra in range(1, outputs):
        nodes.append(helper.make_node("Identity", ["logits"], [f"logits{extra}"]))
        graph_outputs.append(
            helper.make_tensor_value_info(f"logits{extra}", TensorProto.FLOAT, [batch_dim, classes])
        )
    graph = helper.make_graph(nodes, "tiny-text", graph_inputs, graph_outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
