"""What the routes need from an inference server, as a protocol.

:class:`gateway.triton.TritonBackend` is the real one; API tests pass fakes that
produce faults a real server cannot produce on demand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.oip import ModelSignature, Tensor


@dataclass(frozen=True)
class ScoredLabel:
    """One prediction."""

    label: str
    score: float
    class_id: int


@dataclass(frozen=True)
class Classification:
    """The model's answer for one input, predictions highest score first."""

    predictions: list[ScoredLabel]
    model_version: str
    truncated: bool | None = None


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
    """The inference server behind the gateway."""

    async def classify_images(
        self, model: str, version: str, images: Sequence[bytes], top_k: int, request_id: str
    ) -> list[Classification]:
        """One classification per image, in input order; raises GatewayError subclasses."""
        ...

    async def classify_texts(
        self,
        model: str,
        version: str,
        texts: Sequence[str],
        top_k: int,
        candidate_labels: Sequence[str] | None,
        request_id: str,
    ) -> list[Classification]:
        """One classification per text, in input order; raises GatewayError subclasses."""
        ...

    async def model_signature(self, model: str, version: str) -> ModelSignature:
        """The model's metadata (inputs, outputs); NotFoundError for an unknown model."""
        ...

    async def infer_tensors(
        self, model: str, version: str, inputs: Sequence[Tensor], outputs: Sequence[str], request_id: str
    ) -> tuple[str, list[Tensor]]:
        """One inference on checked tensors: (the version that answered, the outputs)."""
        ...

    async def label_set(self, model: str) -> list[str] | None:
        """The labels a label-listing model reports; None when it cannot be asked."""
        ...

    async def repository_index(self) -> list[RepositoryModel]:
        """Every model in Triton's repository, loaded or not; raises GatewayError subclasses."""
        ...

    async def load_model(self, model: str) -> None:
        """Load the model, or reload it if loaded: Triton reloads what changed on disk and
        keeps the loaded one serving until the new one is ready. Raises
        ModelControlError when Triton cannot load it."""
        ...

    async def unload_model(self, model: str, *, dependents: bool) -> None:
        """Unload the model (and, with ``dependents``, the models only it needed)."""
        ...

    async def server_status(self) -> ServerStatus:
        """Never raises: an unreachable server is ``live=False``."""
        ...

    async def model_status(self, model: str, version: str) -> ModelStatus:
        """Never raises: an unreachable server or unknown model is ``ready=False``."""
        ...

    async def close(self) -> None: ...
