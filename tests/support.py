"""Test helpers: sample files of every kind, a gateway served over real HTTP in a thread."""

from __future__ import annotations

import hashlib
import io
import random
import struct
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import uvicorn
from fastapi import FastAPI
from PIL import Image

from gateway.backend import Classification, ModelStatus, ScoredLabel, ServerStatus
from gateway.errors import GatewayError
from gateway.local import free_port


def encode(array: np.ndarray, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, fmt, **options)
    return buffer.getvalue()


@cache
def chelsea_jpeg() -> bytes:
    """scikit-image's photo of Chelsea the cat."""
    from skimage import data

    return encode(data.chelsea(), "JPEG", quality=90)


@cache
def coffee_png() -> bytes:
    """scikit-image's photo of a cup of coffee."""
    from skimage import data

    return encode(data.coffee(), "PNG")


@cache
def coffee_webp() -> bytes:
    from skimage import data

    return encode(data.coffee(), "WEBP", quality=90)


def small_png(width: int = 8, height: int = 8) -> bytes:
    return encode(np.full((height, width, 3), 127, dtype=np.uint8), "PNG")


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_header_only(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims width x height (a decompression-bomb shape)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def truncated_jpeg() -> bytes:
    """A real JPEG cut in half: the header checks pass, decoding fails."""
    data = chelsea_jpeg()
    return data[: len(data) // 2]


def random_bytes(size: int = 4096) -> bytes:
    return random.Random(7).randbytes(size)


def tiff_bytes() -> bytes:
    return encode(np.zeros((4, 4, 3), dtype=np.uint8), "TIFF")


EPS_BYTES = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nnewpath 0 0 moveto showpage\n"
SVG_BYTES = b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"></svg>'


@dataclass
class ServedApp:
    """A FastAPI app served by uvicorn on a free loopback port, in a thread."""

    app: FastAPI
    port: int = 0
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> ServedApp:
        self.port = self.port or free_port()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the gateway did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=15)


@dataclass
class FakeBackend:
    """Answers from the bytes themselves (label = sha1 prefix), or raises what it is told."""

    fail_with: GatewayError | None = None
    live: bool = True
    ready: bool = True
    calls: list[tuple[str, int, str, int]] = field(default_factory=list)
    texts: list[tuple[list[str], list[str] | None]] = field(default_factory=list)
    closed: bool = False

    async def classify_images(
        self, model: str, version: str, inputs: Sequence[bytes], top_k: int, request_id: str
    ) -> list[Classification]:
        self.calls.append((model, len(inputs), request_id, top_k))
        if self.fail_with is not None:
            raise self.fail_with
        return [
            Classification(
                predictions=[
                    ScoredLabel(
                        label=hashlib.sha1(data).hexdigest()[:8], score=1.0 / (rank + 1), class_id=rank
                    )
                    for rank in range(top_k)
                ],
                model_version="3",
            )
            for data in inputs
        ]

    async def classify_texts(
        self,
        model: str,
        version: str,
        texts: Sequence[str],
        top_k: int,
        candidate_labels: Sequence[str] | None,
        request_id: str,
    ) -> list[Classification]:
        """Echoes each text back as its label, so tests can see what reached the backend."""
        self.calls.append((model, len(texts), request_id, top_k))
        self.texts.append((list(texts), None if candidate_labels is None else list(candidate_labels)))
        if self.fail_with is not None:
            raise self.fail_with
        return [
            Classification(
                predictions=[ScoredLabel(label=text, score=1.0, class_id=0)],
                model_version="2",
                truncated=len(text) > 100,
            )
            for text in texts
        ]

    async def label_set(self, model: str) -> list[str] | None:
        return ["sports", "politics"] if self.live else None

    async def server_status(self) -> ServerStatus:
        return ServerStatus(live=self.live, version="2.51.0" if self.live else "")

    async def model_status(self, model: str, version: str) -> ModelStatus:
        steps = [
            ModelStatus(name=n, ready=self.ready, versions=["1"]) for n in (f"{model}.pre", f"{model}.net")
        ]
        return ModelStatus(name=model, ready=self.ready, versions=["1"], platform="ensemble", composing=steps)

    async def close(self) -> None:
        self.closed = True
