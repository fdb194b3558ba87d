"""The task APIs of other servers, decided here: the routes (gateway.http.routes.openai and
the vLLM body of ``/classify``) read a body, call these and render.

- :func:`classify_every_class`: every text against all of a text classifier's classes
  (vLLM's, SGLang's and Dynamo's ``/classify``): the input-kind check is the dispatcher's
  (422 wrong-input-kind for an image classifier, as on ``/classify``); a model with more
  classes than it answers (its ``max_top_k``) is refused.
- :func:`embed`: texts through an embedding model. Embedding models are the gateway's
  non-classifier models (gateway.serving.exposure: ``GATEWAY_V2_MODELS`` and the
  embedding models are one allow-list); ``/v1/embeddings`` serves those that are embedders.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gateway.errors import InvalidInputError, NotFoundError
from gateway.serving.call import Answer, Call
from gateway.serving.caller import may_use
from gateway.serving.dispatch import Dispatcher
from gateway.serving.payload import ClassifyInput
from gateway.settings import OpenAISettings
from gateway.triton.tensors import Tensor


@dataclass(frozen=True)
class ClassRow:
    """One text's answer over every class: the top class and each class's score in the
    model's label order."""

    label: str
    probs: list[float]


async def classify_every_class(
    dispatcher: Dispatcher, model: str, texts: list[str], call: Call
) -> tuple[Answer, list[ClassRow]]:
    catalog = dispatcher.catalog
    entry = catalog.get(model)  # 404 for a model the catalog does not serve
    if not may_use(call.caller, entry.name):
        raise NotFoundError("there is no such model")
    labels = await catalog.label_count(entry) if entry.kind.noun == "text" else None
    if labels is not None and labels > entry.caps.max_top_k:
        raise InvalidInputError(
            f"{entry.name} has {labels} classes and answers at most {entry.caps.max_top_k} "
            "(its max_top_k): probs over every class cannot be given"
        )
    answer = await dispatcher.classify(
        ClassifyInput(texts=texts), call, model=entry.name, top_k=entry.caps.max_top_k
    )
    rows = []
    for result in answer.classifications:
        count = labels or len(result.predictions)
        probs = [0.0] * count
        for prediction in result.predictions:
            if 0 <= prediction.class_id < count:
                probs[prediction.class_id] = prediction.score
        rows.append(ClassRow(result.predictions[0].label if result.predictions else "", probs))
    return answer, rows


async def embed(
    dispatcher: Dispatcher, settings: OpenAISettings, model: str, texts: list[str], call: Call
) -> np.ndarray:
    """The texts' embeddings (little-endian float32, one row a text)."""
    if (
        model not in settings.embedding_models
        or not dispatcher.exposure.non_classifier(model)
        or not may_use(call.caller, model)
    ):
        raise NotFoundError("there is no such embedding model")
    call.model = model  # an allow-listed name: the metrics' model label
    rows = np.array([[text.encode()] for text in texts], dtype=np.object_)
    result = await dispatcher.plane.infer(
        model,
        dispatcher.catalog.version(model),
        [Tensor("TEXT", "BYTES", rows)],
        [settings.embedding_output],
        call.request_id,
        tenant=call.tenant,
    )
    return result.outputs[settings.embedding_output].array.astype("<f4").reshape(len(texts), -1)
