"""One request as the serving side sees it, whichever door it came through, and the
answer a classification gets."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gateway.serving.admission import ANONYMOUS, Tenant
from gateway.serving.caller import Caller
from gateway.serving.predictions import LogEntry
from gateway.triton.backend import Classification


@dataclass
class Call:
    """One request as the serving side sees it. ``model`` is set by the dispatcher as soon
    as it is known (catalogued or allow-listed names only, set before the inference so a
    failure is labelled too) and written through to ``labels``, the request's state, where
    the telemetry layer reads the metrics' model label: no route writes it back."""

    request_id: str
    started: float
    client: str | None = None  # who a canary assignment sticks to (key id, X-Rollout-Key)
    tenant: Tenant = ANONYMOUS  # the API key and its tier: whose share of the limit it takes
    labels: Any = None  # the request's state (GatewayState): only its "model" is written
    caller: Caller | None = None  # who called (its image quotas are charged here)
    logged: LogEntry | None = None  # what the prediction log is told (when it is on)
    _model: str | None = field(default=None, init=False, repr=False)

    @property
    def model(self) -> str | None:
        return self._model

    @model.setter
    def model(self, name: str | None) -> None:
        self._model = name
        if self.labels is not None and name is not None:
            self.labels["model"] = name


ROLLOUT_KEY = b"x-rollout-key"


def bind(call: Call, caller: Caller, headers: Iterable[tuple[bytes, bytes]]) -> Call:
    """``call`` given its caller, the same on both doors: its key and tenant (whose share
    of the limit it takes), and who a canary assignment sticks to (the key's id, else the
    ``X-Rollout-Key`` header or metadata)."""
    call.caller, call.tenant = caller, caller.tenant
    client = caller.client
    if client is None:
        for name, value in headers:  # (a loop, not next() over a generator: every anonymous call)
            if name == ROLLOUT_KEY:
                client = value.decode("latin-1")
                break
    call.client = client
    return call


class Answer(NamedTuple):
    """The classifications, in input order, and the model that produced them."""

    model: str
    classifications: list[Classification]
