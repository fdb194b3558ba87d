"""Request and response bodies, as the OpenAPI document shows them."""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, create_model

from gateway import jsoncodec
from gateway.names import MODEL_REF, VERSION
from gateway.settings import TOP_K_CEILING
from gateway.triton.backend import Classification

# A 1x1 PNG: small enough for /docs' "Try it out" and a real image all the same.
EXAMPLE_PNG_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


class ClassifyJSONRequest(BaseModel):
    """`application/json` body: exactly one of `image`, `images`, `text` or `texts`."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"image": EXAMPLE_PNG_BASE64, "top_k": 3},
                {"images": [EXAMPLE_PNG_BASE64, EXAMPLE_PNG_BASE64]},
                {"text": "The striker scored twice in the final."},
                {
                    "texts": ["Whisk the eggs and fold in the flour."],
                    "candidate_labels": ["cooking", "travel"],
                },
            ]
        },
    )

    image: StrictStr | None = Field(None, description="One image, base64 (a data: URL is accepted).")
    images: list[StrictStr] | None = Field(None, description="Several images, base64, answered in order.")
    text: StrictStr | None = Field(None, description="One text to classify.")
    texts: list[StrictStr] | None = Field(None, description="Several texts, answered in order.")
    candidate_labels: list[StrictStr] | None = Field(
        None,
        description="Texts only: classify against these labels (zero-shot) instead of the configured set.",
    )
    top_k: StrictInt | None = Field(
        None, ge=1, le=TOP_K_CEILING, description="Predictions per input (also a query parameter)."
    )
    threshold: StrictFloat | None = Field(
        None,
        gt=0,
        le=1,
        description="Only labels scoring at least this, best first (also a query parameter): at most "
        "top_k of them when top_k is given, else at most the model's max_top_k; possibly none. "
        "For multi-label (sigmoid) models, the labels that apply.",
    )


@cache
def classify_json_model(images: int, texts: int, candidate_labels: int) -> type[ClassifyJSONRequest]:
    """ClassifyJSONRequest with its lists capped at this gateway's limits (``maxItems`` in
    the OpenAPI document); called as ``classify_json_model(**settings.list_caps())``. The gateway checks the counts itself first (413); these
    bounds document them and keep the validator from walking an oversized list."""
    model: type[ClassifyJSONRequest] = create_model(
        "ClassifyJSONRequest",
        __base__=ClassifyJSONRequest,
        images=(
            list[StrictStr] | None,
            Field(None, max_length=images, description="Several images, base64, answered in order."),
        ),
        texts=(
            list[StrictStr] | None,
            Field(None, max_length=texts, description="Several texts, answered in order."),
        ),
        candidate_labels=(
            list[StrictStr] | None,
            Field(
                None,
                max_length=candidate_labels,
                description="Texts only: classify against these labels (zero-shot) "
                "instead of the configured set.",
            ),
        ),
    )
    model.__doc__ = ClassifyJSONRequest.__doc__
    return model


class Prediction(BaseModel):
    """One label with its probability."""

    label: str = Field(description="Class name, e.g. 'tabby'.")
    score: float = Field(description="Softmax probability in [0, 1].")
    class_id: int = Field(description="Index of the class in the model's label file.")


class ClassificationResult(BaseModel):
    """The predictions for one input, highest score first."""

    index: int = Field(description="Position of the input in the request (0-based).")
    predictions: list[Prediction]
    truncated: bool | None = Field(
        None, description="Texts only: the text was longer than the model's token limit and was cut."
    )


class ClassifyResponse(BaseModel):
    """One result per input, in input order."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "image_classifier",
                    "model_version": "1",
                    "request_id": "0f5c2d1e9b7a4c3d8e6f1a2b3c4d5e6f",
                    "results": [
                        {
                            "index": 0,
                            "predictions": [
                                {"label": "Egyptian cat", "score": 0.37, "class_id": 285},
                                {"label": "tiger cat", "score": 0.37, "class_id": 282},
                            ],
                        }
                    ],
                }
            ]
        }
    )

    model: str = Field(description="The Triton model (ensemble) that answered.")
    model_version: str = Field(description="The version of it that answered.")
    request_id: str = Field(description="Also in the X-Request-ID header and sent to Triton.")
    results: list[ClassificationResult]


def classify_response_json(model: str, request_id: str, answers: list[Classification]) -> bytes:
    """A ClassifyResponse serialised directly (the same document, built without models)."""
    results = []
    for index, answer in enumerate(answers):
        result: dict[str, Any] = {
            "index": index,
            "predictions": [
                {"label": p.label, "score": p.score, "class_id": p.class_id} for p in answer.predictions
            ],
        }
        if answer.truncated is not None:
            result["truncated"] = answer.truncated
        results.append(result)
    body = {
        "model": model,
        "model_version": answers[0].model_version,
        "request_id": request_id,
        "results": results,
    }
    return jsoncodec.dumps(body)


class Problem(BaseModel):
    """An RFC 9457 problem document (`application/problem+json`)."""

    type: str = Field(
        description="Stable identifier of the kind of problem, e.g. urn:triton-gateway:problem:invalid-image"
    )
    title: str
    status: int
    detail: str
    instance: str | None = Field(None, description="The path the request was made to.")
    request_id: str | None = None
    trace_id: str | None = Field(
        None, description="The W3C trace id of this request (32 hex digits), when tracing is on."
    )
    input_index: int | None = Field(None, description="The input (0-based) the problem is about, if one.")
    errors: list[dict[str, Any]] | None = Field(
        None, description="Every problem found, when there are several."
    )
    error: str | dict[str, Any] | None = Field(
        None,
        description="On /v2 routes: the detail again, as the Open Inference Protocol's error. On /v1 "
        "routes: OpenAI's error object (message, type, param, code).",
    )


class ComposingModel(BaseModel):
    """A step of an ensemble."""

    name: str
    ready: bool
    versions: list[str]


class ModelInfo(BaseModel):
    """A classifier of the catalog (a Triton model with a `gateway_task` parameter)."""

    name: str
    task: str = Field(
        description="The model's gateway_task: 'image-classification' or 'text-classification'."
    )
    default: bool = Field(description="POST /classify sends inputs of this kind to this model.")
    ready: bool = Field(
        description="Triton has it ready, and every step of it (the steps themselves are named to "
        "operators only: GET /admin/served)."
    )
    versions: list[str] = Field(description="Versions Triton has ready.")
    platform: str
    accepts: list[str] = Field(description="Input media types.")
    caps: dict[str, Any] = Field(
        description="What the model takes, read from its configuration and narrowed by the settings: "
        "max_top_k, max_inputs, formats and pixel caps (images), candidate_labels and max_tokens (texts)."
    )
    labels: list[str] | None = Field(None, description="The configured label set, where the model lists it.")
    pinned_version: str = Field(
        "", description="The version it is called at (empty: Triton's latest); moved by the admin surface."
    )
    state: Literal["ready", "loading", "unloading", "unavailable", "unloaded"] = Field(
        "ready",
        description="'unloaded': taken out through model control on purpose; 'loading' / 'unloading': "
        "in between; 'unavailable': failing. Only 'ready' takes requests (otherwise 503).",
    )
    drift: DriftState | None = Field(None, description="Its live window against its reference.")


class TritonInfo(BaseModel):
    """The Triton server behind the gateway (its address is not shown)."""

    live: bool
    version: str = Field(description="Triton's server version, empty when it does not answer.")


class DriftReference(BaseModel):
    """A model's reference: what its answers looked like when they were right."""

    inputs: int = Field(description="Inputs it was made of.")
    labels: int = Field(description="Distinct top-1 labels in it.")
    captured_at: float = Field(description="Unix seconds (0: unknown, e.g. a validation set's).")
    source: Literal["captured", "model-config"] = Field(
        description="'captured': frozen from live traffic (POST /admin/models/{name}/reference); "
        "'model-config': the gateway_reference add-model --reference wrote."
    )
    version: str = Field(description="The version it was captured from (empty: every version).")


class DriftVersion(BaseModel):
    """One version's live window and its distance to the reference."""

    inputs: int = Field(description="Classified inputs in the live window (every replica's, with Redis).")
    top_labels: dict[str, int] = Field(description="The five commonest top-1 labels in the window.")
    drift: dict[str, Any] | None = Field(
        description="labels / confidence distances and their thresholds, and whether either is "
        "past its threshold; null without a reference or under min_inputs."
    )
    evaluated_at: float


class DriftState(BaseModel):
    """Drift of a model's answers (GATEWAY_DRIFT__*)."""

    reference: DriftReference | None
    versions: dict[str, DriftVersion]


class ModelsResponse(BaseModel):
    """The catalog: every classifier the gateway exposes."""

    triton: TritonInfo
    models: list[ModelInfo]


class Readiness(BaseModel):
    """/readyz: each check and whether it passed."""

    status: Literal["ready", "degraded"] = Field(
        description="'degraded': a default model was unloaded on purpose; the others are served."
    )
    checks: dict[str, bool]
    unloaded: list[str] = Field(
        default_factory=list, description="Default models unloaded through model control (not failing)."
    )
    models: dict[str, str] = Field(
        default_factory=dict,
        description="Every classifier of the catalog and its state (only the defaults decide readiness).",
    )


class RepositoryEntry(BaseModel):
    """A model in Triton's repository and its state."""

    name: str
    version: str = Field(description="Empty for a model never loaded.")
    state: str = Field(description="READY, LOADING, UNLOADING, UNAVAILABLE, or empty (never loaded).")
    reason: str = Field(description="Why it is not ready ('unloaded' after an unload).")


class RepositoryIndex(BaseModel):
    """Every model in Triton's repository, loaded or not."""

    models: list[RepositoryEntry]


class ModelControlResult(BaseModel):
    """What a load, reload or unload did."""

    model: str
    action: Literal["load", "reload", "unload", "reload-changed"]
    seconds: float = Field(description="How long Triton took.")
    models: list[RepositoryEntry] = Field(description="The repository entries of the model(s) after it.")


class ServedVersion(BaseModel):
    """A classifier of the catalog and the version it is pinned to."""

    name: str
    task: str
    version: str = Field(description="Empty: Triton's latest.")
    composing_models: list[ComposingModel] = Field(
        description="Its ensemble's steps and whether Triton has each ready (empty: not an ensemble)."
    )


class PinRequest(BaseModel):
    """Move a served model's pin."""

    model_config = ConfigDict(extra="forbid")

    version: str = Field(
        pattern=rf"^({VERSION})?$", description="A version Triton has ready; empty: Triton's latest."
    )


class Liveness(BaseModel):
    """/livez."""

    status: str


_TARGET = Field(
    pattern=rf"^{MODEL_REF}$",
    description="A catalogued model of the same task, optionally `:version` (default: its served version).",
)


class CanarySpec(BaseModel):
    """That share of requests is answered by the target (sticky per client)."""

    model_config = ConfigDict(extra="forbid")

    target: str = _TARGET
    weight: float = Field(ge=0, le=1, description="Share of clients (and requests) sent to the target.")


class ShadowSpec(BaseModel):
    """That share of requests is also sent to the target, and the answers compared."""

    model_config = ConfigDict(extra="forbid")

    target: str = _TARGET
    sample: float = Field(ge=0, le=1, description="Share of requests shadowed.")


class RolloutRequest(BaseModel):
    """A rollout of a model: a canary, a shadow, or both."""

    model_config = ConfigDict(extra="forbid")

    canary: CanarySpec | None = None
    shadow: ShadowSpec | None = None


class QuotaStanding(BaseModel):
    """One quota of a key and its use this period (counted across replicas with Redis)."""

    unit: Literal["requests", "images"]
    period: Literal["day", "month"]
    limit: int
    used: int
    remaining: int
    reset_seconds: int = Field(description="Seconds until the period (UTC day or month) ends.")


class KeyStanding(BaseModel):
    """An API key's limits and what it uses now (never its hash)."""

    id: str
    tier: str
    share: float = Field(description="Its tier's weight in the in-flight limit while keys contend.")
    priority: int = Field(description="Its tier's queue priority (higher: admitted first).")
    rate: float | None = Field(description="Requests a second (None: no rate limit).")
    burst: float | None
    in_flight: int = Field(description="In-flight slots it holds on this replica now.")
    quotas: list[QuotaStanding]


class RolloutState(BaseModel):
    """A model's rollout and this replica's statistics of it."""

    model: str
    canary: CanarySpec | None = None
    shadow: ShadowSpec | None = None
    statistics: dict[str, Any] = Field(
        description="This replica's, since the rollout was last set: requests, errors and mean "
        "seconds per arm; shadow outcomes (agree, disagree, error, dropped), agreement, mean "
        "top-k overlap and mean top-1 score difference."
    )


class PromotionResult(BaseModel):
    """What a promotion changed."""

    model: str
    promoted: str = Field(description="The target now served.")
    change: str = Field(description="`pinned` (a version of the same model) or `default` (another model).")
