"""What the gateway needs from an inference server: a narrow transport, as a protocol.

Inference, metadata, status and model control: nothing about images or texts (those
are :mod:`gateway.serving.kinds`) and nothing about admission or fan-out (that is
:mod:`gateway.serving.plane`). :class:`gateway.triton.client.TritonBackend` is the real one; API tests
pass a fake of this protocol (type-checked against it) for faults a real server cannot
produce on demand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from gateway.triton.tensors import Tensor

if TYPE_CHECKING:
    from gateway.errors import InvalidInputError


@dataclass(frozen=True)
class TensorSpec:
    """An input or output of a model, as its metadata declares it (-1: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False  # from the model's config (metadata does not say)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class ModelSignature:
    """A model's metadata: what the protocol's model-metadata route answers."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": list(self.versions),
            "platform": self.platform,
            "inputs": [spec.as_json() for spec in self.inputs],
            "outputs": [spec.as_json() for spec in self.outputs],
        }


class ScoredLabel(NamedTuple):
    """One prediction (a named tuple: made five or more times an answer, and a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``)."""

    label: str
    score: float
    class_id: int


class Classification(NamedTuple):
    """The model's answer for one input, predictions highest score first."""

    predictions: list[ScoredLabel]
    model_version: str
    truncated: bool | None = None


class InferResult(NamedTuple):
    """One inference answer: the version that answered and its outputs by name."""

    model_version: str
    outputs: Mapping[str, Tensor]


@dataclass(frozen=True)
class ModelConfig:
    """What the catalog reads of a model's configuration: its platform, batch cap,
    ``parameters`` (string values), inputs and, for an ensemble, its steps."""

    name: str
    platform: str = ""
    max_batch_size: int = 0
    parameters: Mapping[str, str] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    steps: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelStatus:
    """A model as Triton sees it; ``composing`` lists an ensemble's steps."""

    name: str
    ready: bool
    versions: list[str] = field(default_factory=list)
    platform: str = ""
    composing: list[ModelStatus] = field(default_factory=list)


@dataclass(frozen=True)
class RepositoryModel:
    """One entry of Triton's repository index: a model (version) and its state.

    ``state`` is Triton's (READY, LOADING, UNLOADING, UNAVAILABLE) or "" for a model in
    the repository that was never loaded; ``reason`` says why it is not ready ("unloaded"
    after an unload)."""

    name: str
    version: str = ""
    state: str = ""
    reason: str = ""

    @property
    def unloaded(self) -> bool:
        """Taken out on purpose (an unload), as opposed to failing."""
        return self.state == "UNAVAILABLE" and self.reason == "unloaded"


@dataclass(frozen=True)
class ServerStatus:
    """Whether Triton answers, and what it says it is."""

    live: bool
    version: str = ""


class InferenceBackend(Protocol):
    """The inference server behind the gateway: a transport (inference, metadata and
    configuration, the repository index and control, status), nothing more. The circuit
    breaker, its probe and the signature cache are the serving side's
    (:class:`gateway.serving.guard.GuardedBackend` wraps any transport in them)."""

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[Tensor],
        request_id: str,
        outputs: Sequence[str] = (),
        invalid: InvalidInputError | None = None,
        priority: int = 0,
        classes: Mapping[str, int] | None = None,
    ) -> InferResult:
        """One inference (all outputs when none are named). Raises GatewayError
        subclasses; ``invalid`` is what the server's "invalid argument" means here;
        ``priority`` is Triton's request priority (0: the models' default level; 1: the
        highest, for keys of a tier above the standard one); ``classes``: Triton's
        classification extension, the top classes of an output (by name) answered as
        ``score:index[:label]`` strings instead of its values."""
        ...

    async def model_signature(self, model: str, version: str) -> ModelSignature:
        """The model's metadata (inputs, outputs); NotFoundError for an unknown model."""
        ...

    async def model_config(self, model: str) -> ModelConfig:
        """The loaded model's configuration; NotFoundError when it is not loaded."""
        ...

    async def model_config_document(self, model: str, version: str) -> dict[str, Any]:
        """The model's configuration as Triton's HTTP protocol answers it (JSON, numbers as
        numbers); NotFoundError for a model or version Triton has not loaded."""
        ...

    async def statistics(self, model: str, version: str) -> dict[str, Any]:
        """Triton's inference statistics (``{"model_stats": [...]}``, as its HTTP protocol
        answers them) of ``model`` ("": every model) and ``version`` ("": every version)."""
        ...

    async def repository_index(self) -> list[RepositoryModel]:
        """Every model in Triton's repository, loaded or not; raises GatewayError subclasses."""
        ...

    async def load_model(self, model: str) -> None:
        """Load the model, or reload it if loaded: Triton reloads what changed on disk and
        keeps the loaded one serving until the new one is ready. Raises
        ModelLoadError when Triton cannot load it."""
        ...

    async def unload_model(self, model: str, *, dependents: bool) -> None:
        """Unload the model (and, with ``dependents``, the models only it needed)."""
        ...

    async def is_live(self, within: float) -> bool:
        """Whether the server answers that it is live within ``within`` seconds; never raises."""
        ...

    async def server_status(self) -> ServerStatus:
        """Never raises: an unreachable server is ``live=False``."""
        ...

    async def model_status(self, model: str, version: str) -> ModelStatus:
        """Never raises: an unreachable server or unknown model is ``ready=False``."""
        ...

    async def close(self) -> None: ...
