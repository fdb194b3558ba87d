"""/livez, /readyz, /models and the OpenAPI document, with a fake backend."""

from __future__ import annotations

from fastapi.testclient import TestClient
from support import FakeBackend


def test_livez_never_depends_on_triton(client: TestClient, backend: FakeBackend) -> None:
    backend.live = False
    assert client.get("/livez").json() == {"status": "ok"}


def test_readyz_ready(client: TestClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == {
        "triton_live": True,
        "model:image_classifier": True,
        "model:pre": True,
        "model:net": True,
        "model:post": True,
    }


def test_readyz_not_ready_when_a_model_is_not(client: TestClient, backend: FakeBackend) -> None:
    backend.ready = False
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["retry-after"] == "5"
    assert response.json()["checks"]["model:image_classifier"] is False


def test_models_lists_the_classifier(client: TestClient) -> None:
    body = client.get("/models").json()
    assert body["triton"] == {"url": "127.0.0.1:8001", "live": True, "version": "2.51.0"}
    (model,) = body["models"]
    assert model["name"] == "image_classifier"
    assert model["task"] == "image-classification"
    assert [m["name"] for m in model["composing_models"]] == ["pre", "net", "post"]


def test_openapi_declares_inputs_examples_and_errors(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    operation = spec["paths"]["/classify"]["post"]
    content = operation["requestBody"]["content"]
    assert {"multipart/form-data", "image/jpeg", "image/png", "image/webp", "application/json"} <= set(
        content
    )
    assert content["application/json"]["examples"]
    assert {"400", "413", "415", "422", "502", "503", "504"} <= set(operation["responses"])
    assert operation["responses"]["413"]["content"]["application/problem+json"]["example"]["status"] == 413
    schemas = spec["components"]["schemas"]
    assert {"Problem", "ImageJSONRequest", "ClassifyResponse"} <= set(schemas)


def test_docs_pages_use_local_assets_only(client: TestClient) -> None:
    for path in ("/docs", "/redoc"):
        html = client.get(path).text
        assert "cdn" not in html.lower()
        assert "/docs-assets/" in html
    assert client.get("/docs-assets/swagger/swagger-ui-bundle.js").status_code == 200
    assert client.get("/docs-assets/redoc/redoc.standalone.js").status_code == 200
