"""One Open Inference Protocol inference, as both doors run it: ``POST /v2/models/{model}
[/versions/{version}]/infer`` and gRPC ``ModelInfer``. The doors differ only in how a
body is read and an answer written; the sequence between is here, once, so a door cannot
drift from the other (tests/integration/test_door_parity.py compares them case by case):

1. the prediction log around everything, refusals included;
2. a model named before the body (the HTTP path) is resolved first: unknown, forbidden or
   a bad version is 404 before anything is refused or read;
3. the refusal before the body (gateway.serving.refusal), held as a retry is;
4. the body read (by the door, under its byte budget);
5. a model named by the body (gRPC's message) resolved, as in 2;
6. routed, checked and inferred (gateway.serving.dispatch).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.observe.predictionlog import PredictionLog
from gateway.serving.call import Call
from gateway.serving.dispatch import Dispatcher
from gateway.serving.exposure import OipTarget
from gateway.serving.oip import InferRequest
from gateway.serving.predictions import logged
from gateway.serving.refusal import UnreadBody
from gateway.settings import Settings
from gateway.triton.backend import InferResult


@dataclass(frozen=True)
class OipBody:
    """An inference request's body as a door read it: the model and version it names
    (gRPC's message; empty where the path named them), its JSON-shaped header and its
    binary tensors, ``size`` bytes in all."""

    header: dict[str, Any]
    binary: bytes | memoryview
    size: int
    model: str = ""
    version: str = ""


@dataclass(frozen=True)
class OipAnswer:
    body: OipBody
    request: InferRequest
    result: InferResult
    served: OipTarget  # the model and version that answered (a rollout's canary may)


class OipCalls:
    """Built once by the runtime; both doors call :meth:`infer`."""

    def __init__(self, dispatcher: Dispatcher, prediction_log: PredictionLog, settings: Settings) -> None:
        self.dispatcher = dispatcher
        self.prediction_log = prediction_log
        self.settings = settings

    async def infer(
        self,
        call: Call,
        route: str,
        unread: UnreadBody,
        read: Callable[[], Awaitable[OipBody]],
        named: tuple[str, str] | None = None,
        hold_at_most: float | None = None,
    ) -> OipAnswer:
        """The sequence of the module's docstring. ``named``: the model and version the
        request named before its body; ``hold_at_most``: how long a refusal may be held
        (the gRPC door's half of the call's deadline)."""
        dispatcher = self.dispatcher
        async with logged(self.prediction_log, call, route):
            target = None if named is None else dispatcher.exposure.target(*named, call)  # the pin applies
            async with dispatcher.refusals.before_body(call.tenant, unread, hold_at_most):
                body = await read()
            if target is None:
                target = dispatcher.exposure.target(body.model, body.version, call)
            request, result, served = await dispatcher.infer_request(
                target, body.header, body.binary, body.size, call, self.settings
            )
        return OipAnswer(body, request, result, served)
