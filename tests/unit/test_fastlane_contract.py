"""The fast lane cannot skip a check: every classify route declares nothing the lane does
not do itself (a dependency, a header, another parameter), and the app has no global
dependency; a route that gained one (an auth check, a limit) fails here, not silently."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request

from gateway.app import create_app
from gateway.http.fastlane import unhandled
from gateway.http.routes import classify
from gateway.settings import Settings


def test_every_classify_route_is_one_the_lane_serves_whole() -> None:
    routes = [r for r in classify.router.routes if "POST" in (getattr(r, "methods", None) or ())]
    assert len(routes) == 3
    assert {route.path: unhandled(route) for route in routes} == {route.path: [] for route in routes}  # type: ignore[attr-defined]


def test_the_app_adds_no_dependency_the_lane_would_skip() -> None:
    app = create_app(Settings())
    assert app.router.dependencies == []
    assert classify.router.dependencies == []


async def limit(request: Request) -> None:
    return None


def test_the_check_catches_what_a_route_could_gain() -> None:
    router = APIRouter()

    @router.post("/classify")
    async def guarded(
        request: Request,
        _: Annotated[None, Depends(limit)],
        x_tenant: Annotated[str | None, Header()] = None,
        top_k: int | None = None,
        region: str | None = None,
    ) -> None:
        return None

    [route] = router.routes
    found = unhandled(route)
    assert "dependency 'limit'" in found
    assert "header 'x_tenant'" in found
    assert "query parameter 'region'" in found
    assert not any("top_k" in item for item in found)
