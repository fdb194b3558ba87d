"""The hot routes beneath the framework: ``POST /classify`` and
``POST /models/{model}[/versions/{version}]/classify`` answered by a plain ASGI layer.

FastAPI still declares, documents (OpenAPI) and serves these routes; this layer, the
innermost middleware, takes the common case first: a POST to one of those paths with no
query string, or with a ``top_k`` and ``threshold`` in their plain forms. It sets the scope
as the router would (the matched route, for the metrics' route label and a problem's
``instance``; the path parameters) and calls the same handler, skipping the framework's
router, parameter validation and dependency machinery (about a tenth of a text request's
CPU, docs/explanation/performance.md). Anything else (another parameter value, a trailing
slash, another method, a ``root_path``) goes to FastAPI, whose answers, 422s included, are
the reference: the lane never answers differently, only sooner.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from typing import NamedTuple, Protocol
from urllib.parse import parse_qsl

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import GatewayError
from gateway.http.paths import CLASSIFY_PATH, classify_template
from gateway.http.problems import gateway_error_response
from gateway.settings import TOP_K_CEILING

_TOP_K = re.compile(r"[1-9][0-9]{0,3}")
_THRESHOLD = re.compile(r"(?:0\.[0-9]{1,17}|1(?:\.0{1,17})?)")


# What the lane reads of a request besides its body: a classify route that declares
# anything else (a header, a cookie, another parameter, a dependency: an auth check or a
# limit) would be skipped on the lane; :func:`unhandled` finds it (a test holds it empty).
HANDLED_QUERY = frozenset({"top_k", "threshold"})
HANDLED_PATH = frozenset({"model", "version"})


def unhandled(route: BaseRoute) -> list[str]:
    """What ``route`` (a classify route) declares that the lane does not do."""
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return ["not a FastAPI route"]
    found = [f"dependency {getattr(d.call, '__name__', d.call)!r}" for d in dependant.dependencies]
    found += [f"query parameter {p.name!r}" for p in dependant.query_params if p.name not in HANDLED_QUERY]
    found += [f"path parameter {p.name!r}" for p in dependant.path_params if p.name not in HANDLED_PATH]
    found += [f"header {p.name!r}" for p in dependant.header_params]
    found += [f"cookie {p.name!r}" for p in dependant.cookie_params]
    found += [f"body field {p.name!r}" for p in dependant.body_params]
    found += [f"route dependency {d!r}" for d in getattr(route, "dependencies", [])]
    return found


def _query(raw: bytes) -> tuple[int | None, float | None] | None:
    """top_k and threshold when each is absent or in its plain valid form, else None
    (FastAPI then answers: its 422 for a bad value is the one clients see)."""
    if not raw:
        return None, None
    top_k: int | None = None
    threshold: float | None = None
    seen: set[str] = set()
    for name, value in parse_qsl(raw.decode("latin-1"), keep_blank_values=True):
        if name in seen:
            return None
        seen.add(name)
        if name == "top_k":
            if not _TOP_K.fullmatch(value) or int(value) > TOP_K_CEILING:
                return None
            top_k = int(value)
        elif name == "threshold":
            if not _THRESHOLD.fullmatch(value) or float(value) <= 0:
                return None
            threshold = float(value)
    return top_k, threshold


class LaneMatch(NamedTuple):
    """A request the lane takes: its route, parameters and path parameters."""

    route: BaseRoute
    top_k: int | None
    threshold: float | None
    model: str | None
    version: str | None


class ClassifyRoutes:
    """Which requests the lane takes (a POST to a classify path, without a ``root_path``,
    its query in the plain forms): read by the lane and by the refusal from the request
    head (gateway.http.headshed), which sheds exactly the requests the lane would serve."""

    def __init__(self, routes: list[BaseRoute]) -> None:
        self._routes = routes  # the classify router's (what FastAPI matches for these paths)
        self._by_template: dict[str, BaseRoute] | None = None

    def _route(self, template: str) -> BaseRoute | None:
        if self._by_template is None:
            self._by_template = {
                path: route
                for route in self._routes
                if isinstance(path := getattr(route, "path", None), str)
                and "POST" in (getattr(route, "methods", None) or ())
            }
        return self._by_template.get(template)

    def match(self, scope: Scope) -> LaneMatch | None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        match = CLASSIFY_PATH.fullmatch(scope["path"])
        if match is None:
            return None
        query = _query(scope.get("query_string", b""))
        model, version = match.group(1), match.group(2)
        route = self._route(classify_template(model, version))
        if query is None or route is None:
            return None
        return LaneMatch(route, query[0], query[1], model, version)


def enter_route(scope: Scope, lane: LaneMatch) -> None:
    """Set the scope as the router would (the matched route, the path parameters)."""
    scope["route"] = lane.route
    scope["endpoint"] = getattr(lane.route, "endpoint", None)
    scope["path_params"] = {
        name: value for name, value in (("model", lane.model), ("version", lane.version)) if value is not None
    }


class ClassifyHandler(Protocol):
    """What the classify routes call (gateway.http.routes.classify.classify_request)."""

    def __call__(
        self,
        request: Request,
        top_k: int | None,
        threshold: float | None,
        model: str | None,
        version: str | None,
    ) -> Awaitable[Response]: ...


class FastLane:
    """Answers the classify routes directly (``handler``, the routes' own); everything else
    passes to ``app``."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute], handler: ClassifyHandler) -> None:
        self.app = app
        self.lane = ClassifyRoutes(routes)
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = self.lane.match(scope)
        if lane is None:
            await self.app(scope, receive, send)
            return
        await self._serve(scope, receive, send, lane)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, lane: LaneMatch) -> None:
        enter_route(scope, lane)
        request = Request(scope, receive, send)
        try:
            response = await self.handler(request, lane.top_k, lane.threshold, lane.model, lane.version)
        except GatewayError as exc:
            # as the framework's handler would (anything else rises to its 500 handler)
            response = await gateway_error_response(request, exc)
        except ClientDisconnect:
            return  # nobody to answer (counted as 499 by gateway.http.telemetry)
        await response(scope, receive, send)
