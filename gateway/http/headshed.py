"""Overload refused from the request head, in the HTTP protocol, before any task or
framework runs.

When the gateway sheds a request from its headers (gateway.serving.refusal, the rule
every door asks: draining, or no slot and more waiting than complete within the queue
wait), answering it through uvicorn's request cycle, every middleware and the route costs
about 0.2 ms of gateway CPU; under a retry storm (clients that send again the moment a
503 comes back) that is most of what the gateway spends, on a host whose cores Triton
shares. The HTTP protocol (gateway.http.server) asks :meth:`HeadShed.refuse` once a
request's head is parsed; for the requests the classify lane takes (gateway.http.fastlane:
``POST /classify`` and ``/models/{model}[/versions/{version}]/classify``) and the OIP
door's inferences (``POST /v2/models/{model}[/versions/{version}]/infer``) and the task
routes' (``POST /v1/classify``, ``/v1/embeddings``) that the route
would refuse, it gets the route's answer back (:class:`HeadRefusal`: the same error from
``Refusals.unread_refusal``, with its hold and its ``Connection: close``; the same
problem body and headers) and writes it itself. The refusal is counted and logged as the
route's (``gateway_rejections_total``, the sampled problem line, the caller's
``allowed``) in the call scope every request has (gateway.serving.scope: the request
metrics, the in-flight gauge and the access-log line).

It decides only where nothing else would answer first, and leaves the rest to the full
path: a caller :meth:`CallerGate.plain` cannot name without side effects (a token, a
certificate, a key with a rate or quotas, no key), a model the caller may not use or a
version that is not there (the route's 404 comes before its 503), the admin listener, and
the settings that add to every answer (tracing: the refusal's span; CORS: its headers; a
prediction log, which records refusals). :meth:`HeadShed.build` builds none with tracing
or CORS on, or ``server.shed_at_head`` off.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter

from starlette.requests import Request
from starlette.routing import BaseRoute
from starlette.types import Scope

from gateway import jsoncodec
from gateway.errors import GatewayError, ServiceUnavailableError
from gateway.http.auth import TrustedProxies
from gateway.http.bodies import unread_body_of
from gateway.http.fastlane import ClassifyRoutes, LaneMatch
from gateway.http.paths import INFER, INFER_VERSION, OIP_INFER_PATH, TASK_ROUTES, classify_template
from gateway.http.problems import in_door_form, log_problem
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import Tracing
from gateway.serving.caller import Caller, CallerGate, request_id_of
from gateway.serving.refusal import Refusals
from gateway.serving.scope import CallScope
from gateway.settings import Settings

_NOSNIFF = (b"x-content-type-options", b"nosniff")
_NO_STORE = (b"cache-control", b"no-store")
_CLOSE = (b"connection", b"close")


@dataclass
class HeadRefusal:
    """A request refused from its head: what to write (after ``hold`` seconds), whether
    the connection closes after it, and what its outcome records."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    hold: float
    close: bool
    route: str
    model: str  # the model label its outcome records
    call: CallScope  # its scope, as every call's (gateway.serving.scope)

    @property
    def started(self) -> float:
        return self.call.started


class HeadShed:
    """Decides, from a parsed request head, whether the route would refuse it unread, and
    with what answer (see the module)."""

    def __init__(
        self,
        refusals: Refusals,
        gate: CallerGate,
        metrics: GatewayMetrics,
        tracing: Tracing,
        routes: list[BaseRoute],
        proxies: TrustedProxies,
        admin_port: int | None,
    ) -> None:
        self.refusals = refusals
        self.gate = gate
        self.metrics = metrics
        self.tracing = tracing
        self.lane = ClassifyRoutes(routes)
        self.proxies = proxies
        self.admin_port = admin_port

    @classmethod
    def build(
        cls,
        settings: Settings,
        refusals: Refusals,
        gate: CallerGate,
        metrics: GatewayMetrics,
        tracing: Tracing,
        routes: list[BaseRoute],
        proxies: TrustedProxies,
    ) -> HeadShed | None:
        """The head's refusals, or None where every answer needs the full path."""
        server = settings.server
        if not (server.shed_at_head and server.shed_from_headers):
            return None
        if settings.tracing.enabled or settings.auth.cors_origins:
            return None
        return cls(refusals, gate, metrics, tracing, routes, proxies, settings.admin_listener_port)

    def armed(self) -> bool:
        """The cheap test first (every request head asks): nothing is shed while the queue
        is shorter than the limit, unless the gateway drains."""
        return self.refusals.armed()

    def refuse(self, scope: Scope) -> HeadRefusal | None:
        """The route's refusal of the request whose head ``scope`` holds (method, path,
        query string, headers, client, server, the lifespan's state), or None."""
        started = perf_counter()
        candidate = self._candidate(scope)
        if candidate is None:
            return None
        lane, oip, caller = candidate
        refusals = self.refusals
        if not refusals.refuses(caller.tenant):
            return None
        state = scope["state"]
        try:  # what the route refuses first: its 404 (its 400 for a version that is none)
            if lane is not None:
                state["dispatcher"].check_model(lane.model, lane.version, caller)
                route, model = classify_template(lane.model, lane.version), ""
            elif oip is not None:
                name, version = oip.group(1), oip.group(2) or ""
                state["exposure"].target(name, version, caller=caller)
                route, model = (INFER_VERSION if version else INFER), name
            else:  # a task route: its model is in the body
                route, model = scope["path"], ""
        except GatewayError:
            return None
        self.gate.count_allowed(caller)
        refusal, hold = refusals.unread_refusal(unread_body_of(scope), caller.tenant)
        return self._answer(refusal, hold, route, model, caller.request_id, started, scope)

    def arrived(self, scope: Scope) -> Callable[[], None]:
        """Count the request whose head ``scope`` holds, not refused, as its caller's
        upload until its route runs (gateway.serving.refusal's ``arrived``; named only
        when the rule asks). Returns what ends the count."""
        return self.refusals.arrived(lambda: self._uploader(scope))

    def _uploader(self, scope: Scope) -> str | None:
        """The key id the route would count the request's upload against, where the head
        can name it as :meth:`refuse` does; else None."""
        candidate = self._candidate(scope)
        if candidate is None or unread_body_of(scope).expects_continue:
            return None
        return candidate[2].tenant.id or None

    def _candidate(self, scope: Scope) -> tuple[LaneMatch | None, re.Match[str] | None, Caller] | None:
        """A request the head may answer for the route: one of its inference routes (the
        classify lane's match, or the OIP door's path match; neither for a task route), on
        the public listener, without a prediction log, from a caller
        :meth:`CallerGate.plain` names; else None."""
        if self.admin_port is not None and (scope.get("server") or ("", 0))[1] == self.admin_port:
            return None
        lane = self.lane.match(scope)
        oip = None
        if lane is None:
            if scope["method"] != "POST" or scope.get("root_path"):
                return None
            oip = OIP_INFER_PATH.fullmatch(scope["path"])
            if oip is None and scope["path"] not in TASK_ROUTES:
                return None
        log = scope["state"].get("prediction_log")
        if log is None or log.enabled:
            return None
        headers = scope["headers"]
        try:
            certified = self.proxies.certified(scope)
        except GatewayError:  # a certificate whose name is refused: the route refuses it
            return None
        caller = self.gate.plain(request_id_of(headers), headers, certified)
        if caller is None:
            return None
        return lane, oip, caller

    def _answer(
        self,
        refusal: ServiceUnavailableError,
        hold: float,
        route: str,
        model: str,
        request_id: str,
        started: float,
        scope: Scope,
    ) -> HeadRefusal:
        """As the framework's handler answers ``refusal`` (gateway.http.problems, in the
        door's error form), with the headers every answer carries (gateway.http.requestid)."""
        self.metrics.rejections.labels(refusal.slug).inc()
        log_problem(Request(scope), refusal)
        problem = refusal.problem(request_id, route)
        media_type = in_door_form(problem, refusal, scope["path"])
        body = jsoncodec.dumps(problem)
        close = self.refusals.admission.draining or refusal.headers.get("Connection") == "close"
        headers = [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in refusal.headers.items()
            if name.lower() != "connection"
        ]
        headers += [
            (b"content-length", str(len(body)).encode("ascii")),
            (b"content-type", media_type.encode("ascii")),
            (b"x-request-id", request_id.encode("latin-1")),
            _NOSNIFF,
            _NO_STORE,
        ]
        if close:
            headers.append(_CLOSE)
        call = CallScope(
            self.metrics, self.tracing, "POST", scope["path"], scope["headers"], request_id, started
        )
        return HeadRefusal(refusal.status, headers, body, hold, close, route, model, call)

    def answered(self, refusal: HeadRefusal) -> None:
        """Close the refusal's call scope once it is written (its hold included)."""
        refusal.call.close(refusal.route, refusal.status, refusal.model)
