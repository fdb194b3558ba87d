"""/livez, /readyz, /models and the OpenAPI document, with a fake backend."""

from __future__ import annotations

from fastapi.testclient import TestClient

from helpers.support import FakeBackend, small_png


def test_livez_never_depends_on_triton(client: TestClient, backend: FakeBackend) -> None:
    backend.live = False
    assert client.get("/livez").json() == {"status": "ok"}


def test_readyz_ready(client: TestClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == {
        "accepting": True,
        "triton_live": True,
        "model:image_classifier": True,  # with its steps, which are not named
        "model:text_classifier": True,
    }


def test_readyz_not_ready_when_a_model_is_not(client: TestClient, backend: FakeBackend) -> None:
    backend.ready = False
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["retry-after"] == "5"
    assert response.json()["checks"]["model:image_classifier"] is False


def test_models_lists_the_classifier(client: TestClient) -> None:
    response = client.get("/models")
    body = response.json()
    assert body["triton"] == {"live": True, "version": "2.51.0"}
    assert "8001" not in response.text  # Triton's address is not revealed
    image, text = body["models"]  # the two with a gateway_task; steps and text_labels are not
    assert image["name"] == "image_classifier"
    assert image["task"] == "image-classification"
    assert image["default"] is True
    assert "composing_models" not in image
    assert ".pre" not in response.text
    assert image["labels"] is None
    # caps read from the model's configuration (its steps), not from settings
    assert image["caps"]["max_top_k"] == 20
    assert image["caps"]["max_pixels"] == 40_000_000
    assert image["caps"]["formats"] == ["JPEG", "PNG", "WEBP"]
    assert text["name"] == "text_classifier"
    assert text["task"] == "text-classification"
    assert text["accepts"] == ["application/json"]
    assert text["labels"] == ["sports", "politics"]
    assert text["caps"]["candidate_labels"] is True
    assert text["caps"]["max_inputs"] == 64


def test_models_can_serve_one_kind_only(backend: FakeBackend) -> None:
    from gateway.app import create_app
    from gateway.settings import Settings

    with TestClient(create_app(Settings(image_model=""), backend_factory=lambda *_: backend)) as client:
        listed = {m["name"]: m["default"] for m in client.get("/models").json()["models"]}
        assert listed == {"image_classifier": False, "text_classifier": True}
        assert "model:image_classifier" not in client.get("/readyz").json()["checks"]
        response = client.post("/classify", content=b"\xff\xd8\xff", headers={"content-type": "image/jpeg"})
        assert response.status_code == 422
        assert response.json()["detail"] == "this gateway serves no image model"
        # the image classifier is still reachable by name
        named = client.post(
            "/models/image_classifier/classify", content=small_png(), headers={"content-type": "image/png"}
        )
        assert named.status_code == 200, named.text


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
    assert {"Problem", "ClassifyJSONRequest", "ClassifyResponse"} <= set(schemas)
    assert {"text", "texts", "candidate_labels"} <= set(schemas["ClassifyJSONRequest"]["properties"])


def test_docs_pages_use_local_assets_only(client: TestClient) -> None:
    for path in ("/docs", "/redoc"):
        html = client.get(path).text
        assert "cdn" not in html.lower()
        assert "/docs-assets/" in html
    assert client.get("/docs-assets/swagger/swagger-ui-bundle.js").status_code == 200
    assert client.get("/docs-assets/redoc/redoc.standalone.js").status_code == 200
