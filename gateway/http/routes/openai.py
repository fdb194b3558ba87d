"""The task APIs of other servers, for the clients written for them.

- ``POST /v1/classify`` (SGLang, NVIDIA Dynamo; vLLM serves the same at ``POST /classify``,
  which the gateway answers too when the body has ``input``: see gateway.http.routes.classify)
  over every text classifier of the catalog: ``{"model", "input": str | [str]}`` ->
  ``{"id", "object": "list", "created", "model", "data": [{"index", "label", "probs",
  "num_classes"}], "usage"}``, ``probs`` over every class in the model's label order.
- ``POST /v1/embeddings`` (OpenAI) over the embedding models (``GATEWAY_OPENAI__EMBEDDING_MODELS``,
  ``text_embedder`` by default), ``encoding_format`` ``float`` or ``base64`` (little-endian
  float32, as OpenAI sends it).
- ``GET /v1/models``: what these routes serve, in OpenAI's list shape.

Keys, limits, admission, deadlines, metrics and traces are the gateway's, as on its own
routes; errors carry OpenAI's ``{"error": {"message", "type", "code"}}`` beside the problem
members (gateway.http.problems). ``usage`` counts no tokens (0): the tokenizer runs in Triton.
"""

from __future__ import annotations

import base64
import time
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from gateway import jsoncodec
from gateway.errors import InvalidInputError, NotFoundError, summarise_validation_errors
from gateway.http.bodies import expects_continue, read_json
from gateway.http.dependencies import GatewayState, gateway_state, new_call
from gateway.http.problems import problem_responses
from gateway.names import TEXT_TASK
from gateway.serving.dispatch import Answer, Call
from gateway.serving.jsonguard import JsonBounds
from gateway.serving.payload import ClassifyInput
from gateway.serving.validation import check_count, normalize_text
from gateway.settings import Settings
from gateway.triton.tensors import Tensor

router = APIRouter(prefix="/v1", tags=["openai"])

TextInput = Annotated[
    StrictStr | list[StrictStr], Field(description="One text or several, answered in order.")
]


class ClassifyTaskRequest(BaseModel):
    """vLLM's, SGLang's and Dynamo's classification request."""

    model_config = ConfigDict(extra="ignore")  # their clients send fields of their own (user, priority)

    model: StrictStr = Field(description="A text classifier of the catalog.")
    input: TextInput


class ClassData(BaseModel):
    index: int
    label: str = Field(description="The top class.")
    probs: list[float] = Field(description="Every class's score, in the model's label order.")
    num_classes: int


class Usage(BaseModel):
    prompt_tokens: int = Field(0, description="Always 0: the tokenizer runs in Triton.")
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: None = None


class ClassifyTaskResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ClassData]
    usage: Usage


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request (texts only: token arrays are refused)."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    input: TextInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="Only the model's own size is accepted.")
    user: str | None = None


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "triton-gateway"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def _bounds(settings: Settings) -> JsonBounds:
    """A body of one list of texts and a few scalars, within the text caps."""
    return JsonBounds(
        max_depth=2,
        max_tokens=2 * (settings.text.max_texts + 32),
        max_string_bytes=6 * settings.text.max_chars + 64,  # every character escaped
        max_bare_bytes=64 * 1024,
        text_keys=frozenset({b"input"}),
        text_limit=settings.max_text_body_bytes,
    )


def _texts(raw: str | list[str], settings: Settings) -> list[str]:
    items = [raw] if isinstance(raw, str) else raw
    check_count(len(items), settings.text.max_texts, "inputs")
    return [normalize_text(text, settings.text.max_chars, f"input {i}") for i, text in enumerate(items)]


async def _body(request: Request, state: GatewayState, model: type[BaseModel]) -> Any:
    settings = state["settings"]
    body = await read_json(
        request,
        settings.max_text_body_bytes,
        settings.server.body_timeout_seconds,
        _bounds(settings),
        state["workers"],
    )
    try:
        return model.model_validate(body.document)
    except ValidationError as exc:
        raise InvalidInputError(
            "the JSON body is invalid", errors=summarise_validation_errors(exc.errors(), model.model_fields)
        ) from exc


def _json(model: BaseModel) -> Response:
    return Response(jsoncodec.dumps(model.model_dump()), media_type="application/json")


async def classify_task(
    state: GatewayState, model: str, texts: list[str], call: Call
) -> tuple[ClassifyTaskResponse, Answer]:
    """Every text, all of its model's classes: the answer of vLLM's and SGLang's routes
    (and the gateway's own answer, for the prediction log)."""
    dispatcher, catalog = state["dispatcher"], state["catalog"]
    entry = catalog.get(model)  # 404 for a model the catalog does not serve
    if entry.task != TEXT_TASK:
        raise InvalidInputError(f"{entry.name} is not a text classifier")
    labels = await catalog.label_count(entry)
    if labels is not None and labels > entry.caps.max_top_k:
        raise InvalidInputError(
            f"{entry.name} has {labels} classes and answers at most {entry.caps.max_top_k} "
            "(its max_top_k): probs over every class cannot be given"
        )
    answer = await dispatcher.classify(
        ClassifyInput(texts=texts), call, model=entry.name, top_k=entry.caps.max_top_k
    )
    data = []
    for index, result in enumerate(answer.classifications):
        count = labels or len(result.predictions)
        probs = [0.0] * count
        for prediction in result.predictions:
            if 0 <= prediction.class_id < count:
                probs[prediction.class_id] = prediction.score
        top = result.predictions[0].label if result.predictions else ""
        data.append(ClassData(index=index, label=top, probs=probs, num_classes=count))
    task = ClassifyTaskResponse(
        id=f"classify-{call.request_id}",
        created=int(time.time()),
        model=answer.model,
        data=data,
        usage=Usage(),
    )
    return task, answer


@router.post(
    "/classify",
    summary="Classify texts as vLLM, SGLang and Dynamo do (probs over every class)",
    response_model=ClassifyTaskResponse,
    responses=problem_responses(400, 404, 408, 413, 422, 503, 504, media_type="application/json"),
)
async def classify(request: Request) -> Response:
    state = gateway_state(request)
    call = new_call(request, state, state.get("client"))
    async with state["dispatcher"].admission_before_body(call, expects_continue(request)):
        parsed: ClassifyTaskRequest = await _body(request, state, ClassifyTaskRequest)
        task, _ = await classify_task(state, parsed.model, _texts(parsed.input, state["settings"]), call)
    return _json(task)


@router.post(
    "/embeddings",
    summary="Embed texts as OpenAI's embeddings API does",
    response_model=EmbeddingsResponse,
    responses=problem_responses(400, 404, 408, 413, 422, 503, 504, media_type="application/json"),
)
async def embeddings(request: Request) -> Response:
    state = gateway_state(request)
    settings, dispatcher = state["settings"], state["dispatcher"]
    call = new_call(request, state)
    async with dispatcher.admission_before_body(call, expects_continue(request)):
        parsed: EmbeddingsRequest = await _body(request, state, EmbeddingsRequest)
        if parsed.model not in settings.openai.embedding_models:
            raise NotFoundError("there is no such embedding model")
        call.model = parsed.model  # an allow-listed name: the metrics' model label
        texts = _texts(parsed.input, settings)
        rows = np.array([[text.encode()] for text in texts], dtype=np.object_)
        version = dispatcher.catalog.version(parsed.model)
        result = await dispatcher.plane.infer(
            parsed.model,
            version,
            [Tensor("TEXT", "BYTES", rows)],
            [settings.openai.embedding_output],
            call.request_id,
            admitted=not call.admitted,
            tenant=call.tenant,
        )
    vectors = result.outputs[settings.openai.embedding_output].array.astype("<f4")
    if parsed.dimensions is not None and parsed.dimensions != vectors.shape[-1]:
        raise InvalidInputError(
            f"{parsed.model} embeds in {vectors.shape[-1]} dimensions, not {parsed.dimensions}"
        )
    data = [
        Embedding(
            index=index,
            embedding=base64.b64encode(row.tobytes()).decode()
            if parsed.encoding_format == "base64"
            else row.tolist(),
        )
        for index, row in enumerate(vectors.reshape(len(texts), -1))
    ]
    return _json(EmbeddingsResponse(data=data, model=parsed.model, usage=Usage(completion_tokens=None)))


@router.get("/models", summary="The models these routes serve, in OpenAI's shape", response_model=ModelList)
async def models(request: Request) -> Response:
    state = gateway_state(request)
    names = [entry.name for entry in state["catalog"].entries() if entry.task == TEXT_TASK]
    names += list(state["settings"].openai.embedding_models)
    return _json(ModelList(data=[ModelCard(id=name) for name in dict.fromkeys(names)]))
