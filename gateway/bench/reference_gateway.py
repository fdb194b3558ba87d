"""The least a gateway in front of Triton can be, as the benchmark's yardstick: FastAPI,
``tritonclient.grpc.aio``, the same route and transports as /classify (text JSON, a raw
image body, multipart images, a base64 image in JSON), and nothing else: no checks, no
metrics, no logs, no limits.

    python -m gateway.bench.reference_gateway --port 8090 --triton 127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import tritonclient.grpc.aio as grpcclient
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile


def _input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _results(answer: grpcclient.InferResult) -> list[list[dict[str, object]]]:
    rows = zip(
        answer.as_numpy("LABELS"), answer.as_numpy("SCORES"), answer.as_numpy("CLASS_IDS"), strict=True
    )
    return [
        [
            {"label": label.decode(), "score": float(score), "class_id": int(i)}
            for label, score, i in zip(*row, strict=True)
        ]
        for row in rows
    ]


def create_app(triton_url: str) -> FastAPI:
    clients: dict[str, grpcclient.InferenceServerClient] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        clients["triton"] = grpcclient.InferenceServerClient(triton_url)
        yield
        await clients["triton"].close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/livez")
    async def livez() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/classify")
    async def classify(request: Request) -> JSONResponse:
        triton = clients["triton"]
        top_k = np.array([[5]], dtype=np.int32)
        content_type = request.headers.get("content-type", "")
        if content_type.startswith("application/json"):
            document = await request.json()
            if "image" in document:
                images = [base64.b64decode(document["image"])]
            else:
                texts = np.array([[document["text"].encode()]], dtype=np.object_)
                answer = await triton.infer(
                    "text_classifier", [_input("TEXT", texts, "BYTES"), _input("TOP_K", top_k, "INT32")]
                )
                return JSONResponse({"model": "text_classifier", "results": _results(answer)})
        elif content_type.startswith("image/"):
            images = [await request.body()]
        else:
            async with request.form() as form:
                images = [await part.read() for part in form.getlist("file") if isinstance(part, UploadFile)]

        async def one(data: bytes) -> list[list[dict[str, object]]]:
            image = _input("IMAGE", np.array([[data]], dtype=np.object_), "BYTES")
            return _results(await triton.infer("image_classifier", [image, _input("TOP_K", top_k, "INT32")]))

        answers = await asyncio.gather(*(one(data) for data in images))
        return JSONResponse({"model": "image_classifier", "results": [a[0] for a in answers]})

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--triton", required=True, help="Triton's gRPC host:port")
    options = parser.parse_args()
    uvicorn.run(
        create_app(options.triton),
        host="127.0.0.1",
        port=options.port,
        http="httptools",
        access_log=False,
        log_level="warning",
    )
