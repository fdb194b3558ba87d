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
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from gateway import jsoncodec
from gateway.errors import InvalidInputError, summarise_validation_errors
from gateway.http.bodies import read_json, unread_body
from gateway.http.dependencies import GatewayState, gateway_state, new_call
from gateway.http.paths import TASK_CLASSIFY, TASK_EMBEDDINGS, TASK_PREFIX, relative
from gateway.http.problems import problem_responses
from gateway.http.tasks import ClassifyTaskResponse, Usage, task_response
from gateway.names import TEXT_TASK
from gateway.serving.caller import may_use
from gateway.serving.jsonguard import JsonBounds
from gateway.serving.predictions import logged
from gateway.serving.tasks import classify_every_class, embed
from gateway.serving.validation import check_count, normalize_text
from gateway.settings import Settings

router = APIRouter(prefix=TASK_PREFIX, tags=["openai"])

TextInput = Annotated[
    StrictStr | list[StrictStr], Field(description="One text or several, answered in order.")
]


class ClassifyTaskRequest(BaseModel):
    """vLLM's, SGLang's and Dynamo's classification request."""

    model_config = ConfigDict(extra="ignore")  # their clients send fields of their own (user, priority)

    model: StrictStr = Field(description="A text classifier of the catalog.")
    input: TextInput


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
        partial(_bounds, settings),
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


@router.post(
    relative(TASK_CLASSIFY, TASK_PREFIX),
    summary="Classify texts as vLLM, SGLang and Dynamo do (probs over every class)",
    response_model=ClassifyTaskResponse,
    responses=problem_responses(400, 404, 408, 413, 422, 503, 504, media_type="application/json"),
)
async def classify(request: Request) -> Response:
    state = gateway_state(request)
    call = new_call(request, state)
    dispatcher = state["dispatcher"]
    async with (
        logged(state["prediction_log"], call, TASK_CLASSIFY),
        dispatcher.before_body(call, unread_body(request)) as upload,
    ):
        parsed: ClassifyTaskRequest = await _body(request, state, ClassifyTaskRequest)
        upload.done()
        texts = _texts(parsed.input, state["settings"])
        answer, rows = await classify_every_class(dispatcher, parsed.model, texts, call)
    return task_response(call.request_id, answer, rows)


@router.post(
    relative(TASK_EMBEDDINGS, TASK_PREFIX),
    summary="Embed texts as OpenAI's embeddings API does",
    response_model=EmbeddingsResponse,
    responses=problem_responses(400, 404, 408, 413, 422, 503, 504, media_type="application/json"),
)
async def embeddings(request: Request) -> Response:
    state = gateway_state(request)
    settings, dispatcher = state["settings"], state["dispatcher"]
    call = new_call(request, state)
    async with dispatcher.before_body(call, unread_body(request)) as upload:
        parsed: EmbeddingsRequest = await _body(request, state, EmbeddingsRequest)
        upload.done()
        texts = _texts(parsed.input, settings)
        vectors = await embed(dispatcher, settings.openai, parsed.model, texts, call)
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
        for index, row in enumerate(vectors)
    ]
    return _json(EmbeddingsResponse(data=data, model=parsed.model, usage=Usage(completion_tokens=None)))


@router.get("/models", summary="The models these routes serve, in OpenAI's shape", response_model=ModelList)
async def models(request: Request) -> Response:
    state = gateway_state(request)
    names = [entry.name for entry in state["catalog"].entries() if entry.task == TEXT_TASK]
    exposure = state["exposure"]
    names += [name for name in state["settings"].openai.embedding_models if exposure.non_classifier(name)]
    caller = state["caller"]
    shown = [name for name in dict.fromkeys(names) if may_use(caller, name)]  # the key's models
    return _json(ModelList(data=[ModelCard(id=name) for name in shown]))
