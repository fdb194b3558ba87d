"""Test helpers: sample files of every kind, a gateway served over real HTTP in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import io
import random
import shutil
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np
import pytest
import uvicorn
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient
from PIL import Image

from gateway.dev.tritonserver import free_port
from gateway.errors import GatewayError, InvalidInputError, NotFoundError, TritonUnavailableError
from gateway.http.server import server_config
from gateway.settings import Settings
from gateway.triton.backend import (
    InferenceBackend,
    InferResult,
    ModelConfig,
    ModelSignature,
    ModelStatus,
    RepositoryModel,
    ServerStatus,
    TensorSpec,
)
from gateway.triton.tensors import Tensor


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
    settings: Settings  # what the app was built with: the server's timeouts and caps
    port: int = 0
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    _loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        assert self._server is not None

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            assert self._server is not None
            await self._server.serve()

        asyncio.run(serve())

    def start(self, timeout: float = 20.0) -> ServedApp:
        # A port free_port found can be taken by another process before uvicorn binds it
        # (a clean-clone run failed so: EADDRINUSE); one we chose is chosen again.
        chosen = not self.port
        for attempt in range(3):
            self.port = self.port or free_port()
            # The gateway's own uvicorn configuration (timeouts, caps, no banner).
            config = server_config(self.app, self.settings, "127.0.0.1", self.port)
            self._server = uvicorn.Server(config)
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
            deadline = time.monotonic() + timeout
            while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            if self._server.started:
                return self
            if self._thread.is_alive() or not chosen or attempt == 2:
                break
            self.port = 0
        raise RuntimeError("the gateway did not start")

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the server's event loop (for objects bound to it)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(callback)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=15)
            if self._thread.is_alive():  # a gateway that does not stop is a finding, not a wait
                raise AssertionError(f"the gateway did not stop within 15 s:\n{self._pending()}")

    def _pending(self) -> str:
        """What the server's loop is still awaiting: each task's chain of awaits."""
        lines: list[str] = []
        loop = self._loop
        for task in asyncio.all_tasks(loop) if loop is not None else ():
            lines.append(repr(task))
            awaited: Any = task.get_coro()
            while awaited is not None:
                frame = getattr(awaited, "cr_frame", None)
                if frame is not None:
                    lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
                awaited = getattr(awaited, "cr_await", None)
        return "\n".join(lines)


def _shipped(name: str) -> tuple[int, dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """A shipped model's max_batch_size, parameters, inputs and steps, read from its
    config.pbtxt in model_repository/ (the fake never restates them)."""
    from gateway.triton import pbtxt

    config = pbtxt.read_config(
        Path(__file__).resolve().parents[2] / "model_repository" / name / "config.pbtxt"
    )
    steps = tuple(step.model_name for step in config.ensemble_scheduling.step)
    return config.max_batch_size, pbtxt.parameters(config), tuple(i.name for i in config.input), steps


def fake_repository() -> dict[str, ModelConfig]:
    """The models the fake backend "serves": the two default classifiers as ensembles
    with two steps each (their inputs, batch sizes and parameters, and their steps' caps,
    read from the shipped configs in model_repository/), and text_labels."""

    def classifier(name: str) -> list[ModelConfig]:
        batch, parameters, inputs, shipped_steps = _shipped(name)
        step_parameters: dict[str, str] = {}
        for step in shipped_steps:
            step_parameters.update(_shipped(step)[1])
        steps = (f"{name}.pre", f"{name}.net")
        caps = {
            k: v
            for k, v in step_parameters.items()
            if k in ("formats", "max_pixels", "max_side", "max_tokens")
        }
        return [
            ModelConfig(name, "ensemble", batch, parameters, inputs, steps),
            ModelConfig(steps[0], "python", batch, caps),
            ModelConfig(steps[1], "python", batch, {"max_top_k": step_parameters["max_top_k"]}),
        ]

    models = [
        *classifier("image_classifier"),
        *classifier("text_classifier"),
        ModelConfig("text_labels", "python", 0, {}, ("QUERY",)),
    ]
    return {model.name: model for model in models}


_SIGNATURES = {
    "IMAGE": ("BYTES", (-1, 1), False),
    "TEXT": ("BYTES", (-1, 1), False),
    "TOP_K": ("INT32", (-1, 1), False),
    "CANDIDATE_LABELS": ("BYTES", (-1, -1), True),
}


@dataclass
class FakeBackend:
    """A fake of the transport (gateway.triton.backend.InferenceBackend, checked by mypy through
    ``as_backend``): answers images from their bytes (label = sha1 prefix), echoes texts,
    or raises what it is told."""

    fail_with: GatewayError | None = None
    live: bool = True
    ready: bool = True
    models: dict[str, ModelConfig] = field(default_factory=fake_repository)
    # (model, inputs in the call, request id, top_k), one per Triton call
    calls: list[tuple[str, int, str, int]] = field(default_factory=list)
    texts: list[tuple[list[str], list[str] | None]] = field(default_factory=list)
    closed: bool = False
    # Model control: what was unloaded, the versions Triton "has", the calls made.
    unloaded: set[str] = field(default_factory=set)
    ready_versions: tuple[str, ...] = ("", "1", "2", "3")
    versions_called: list[str] = field(default_factory=list)
    control: list[tuple[str, str]] = field(default_factory=list)
    # Like Triton's Python-backend models, an unload can return before it is done: the
    # repository index says UNLOADING for this many reads after one.
    unloading_reads: int = 0
    _still_unloading: dict[str, int] = field(default_factory=dict)

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[Tensor],
        request_id: str,
        outputs: Sequence[str] = (),
        invalid: InvalidInputError | None = None,
        priority: int = 0,
        classes: Mapping[str, int] | None = None,
    ) -> InferResult:
        given = {tensor.name: tensor for tensor in inputs}
        if model in self.unloaded or model not in self.models:
            raise TritonUnavailableError("Triton or the model is not available", headers={"Retry-After": "5"})
        if "QUERY" in given:
            labels = ["sports", "politics"] if self.live else None
            if labels is None:
                raise TritonUnavailableError("down")
            return InferResult("1", {"LABELS": _bytes_tensor("LABELS", [labels])})
        top_k = int(given["TOP_K"].array.reshape(-1)[0]) if "TOP_K" in given else 1
        rows = given["IMAGE" if "IMAGE" in given else "TEXT"].array.reshape(-1)
        self.calls.append((model, len(rows), request_id, top_k))
        self.versions_called.append(version)
        if "TEXT" in given:
            texts = [bytes(t).decode() for t in rows]
            labels_given = given.get("CANDIDATE_LABELS")
            candidates = None if labels_given is None else [bytes(x).decode() for x in labels_given.array[0]]
            self.texts.append((texts, candidates))
        if self.fail_with is not None:
            raise self.fail_with
        if "TEXT" in given:
            return InferResult(
                "2",
                {
                    "LABELS": _bytes_tensor("LABELS", [[t] for t in texts]),
                    "SCORES": Tensor("SCORES", "FP32", np.ones((len(texts), 1), dtype=np.float32)),
                    "CLASS_IDS": Tensor("CLASS_IDS", "INT32", np.zeros((len(texts), 1), dtype=np.int32)),
                    "TRUNCATED": Tensor("TRUNCATED", "BOOL", np.array([[len(t) > 100] for t in texts])),
                },
            )
        hashed = [[hashlib.sha1(bytes(data)).hexdigest()[:8]] * top_k for data in rows]
        scores = [[1.0 / (rank + 1) for rank in range(top_k)] for _ in rows]
        return InferResult(
            "3",
            {
                "LABELS": _bytes_tensor("LABELS", hashed),
                "SCORES": Tensor("SCORES", "FP32", np.array(scores, dtype=np.float32)),
                "CLASS_IDS": Tensor(
                    "CLASS_IDS", "INT32", np.array([list(range(top_k))] * len(rows), dtype=np.int32)
                ),
            },
        )

    async def is_live(self, within: float) -> bool:
        return self.live

    async def model_signature(self, model: str, version: str) -> ModelSignature:
        config = self.models.get(model)
        if config is None or model in self.unloaded:
            raise NotFoundError("there is no such model version")
        specs = tuple(TensorSpec(name, *_SIGNATURES[name]) for name in config.inputs)
        outputs = tuple(TensorSpec(name, "BYTES", (-1, -1)) for name in ("LABELS",))
        return ModelSignature(model, ("1",), config.platform, specs, outputs)

    async def model_config(self, model: str) -> ModelConfig:
        if model not in self.models or model in self.unloaded:
            raise NotFoundError(f"no loaded model {model}")
        return self.models[model]

    async def server_status(self) -> ServerStatus:
        return ServerStatus(live=self.live, version="2.51.0" if self.live else "")

    async def model_status(self, model: str, version: str) -> ModelStatus:
        if model in self.unloaded or version not in self.ready_versions or model not in self.models:
            return ModelStatus(name=model, ready=False)
        steps = [ModelStatus(name=n, ready=self.ready, versions=["1"]) for n in self.models[model].steps]
        return ModelStatus(name=model, ready=self.ready, versions=["1"], platform="ensemble", composing=steps)

    async def model_config_document(self, model: str, version: str) -> dict[str, Any]:
        config = self.models.get(model)
        if config is None or model in self.unloaded or version not in self.ready_versions:
            raise NotFoundError("there is no such model version")
        document: dict[str, Any] = {
            "name": model,
            "platform": config.platform,
            "max_batch_size": config.max_batch_size,
            "input": [{"name": name, "data_type": "TYPE_STRING", "dims": [1]} for name in config.inputs],
            "output": [{"name": "LABELS", "data_type": "TYPE_STRING", "dims": [-1]}],
            "parameters": {key: {"string_value": value} for key, value in config.parameters.items()},
        }
        if config.steps:
            document["ensemble_scheduling"] = {
                "step": [{"model_name": step, "model_version": -1} for step in config.steps]
            }
        return document

    async def statistics(self, model: str, version: str) -> dict[str, Any]:
        names = [model] if model else list(self.models)
        if model and model not in self.models:
            raise NotFoundError("there is no such model version")
        return {
            "model_stats": [{"name": name, "version": version or "1", "inference_count": 3} for name in names]
        }

    async def repository_index(self) -> list[RepositoryModel]:
        if not self.live:
            raise TritonUnavailableError("down")
        # every version Triton "has" is listed ready (the catalog's versions come from here)
        unloading = set(self._still_unloading)
        self._still_unloading = {name: left - 1 for name, left in self._still_unloading.items() if left > 1}
        return [
            RepositoryModel(name, "1", "UNLOADING")
            if name in unloading
            else RepositoryModel(name, "1", "UNAVAILABLE", "unloaded")
            if name in self.unloaded
            else RepositoryModel(name, version, "READY")
            for name in self.models
            for version in ([v for v in self.ready_versions if v] if name not in self.unloaded else ["1"])
        ]

    async def load_model(self, model: str) -> None:
        self.control.append(("load", model))
        self.unloaded.discard(model)

    async def unload_model(self, model: str, *, dependents: bool) -> None:
        self.control.append(("unload", model))
        self.unloaded.add(model)
        if self.unloading_reads:
            self._still_unloading[model] = self.unloading_reads

    async def close(self) -> None:
        self.closed = True


def _bytes_tensor(name: str, rows: list[list[str]]) -> Tensor:
    return Tensor(name, "BYTES", np.array([[x.encode() for x in row] for row in rows], dtype=np.object_))


def as_backend(fake: FakeBackend) -> InferenceBackend:
    """The fake where the app takes a backend: mypy checks here that it is one."""
    return fake


def settled_metric_series(client: TestClient, prefix: str = "gateway_") -> set[str]:
    """The names (with labels) of the series ``client``'s ``/metrics`` lists under
    ``prefix``, once the drift window's first pass has made its own (one per served model
    version, ``drift.interval_seconds`` after start: they once landed mid-test on a loaded
    machine). Give the app a short drift interval; a test that counts series compares two
    of these sets, so a failure names what is new."""

    def names() -> set[str]:
        text = client.get("/metrics").text
        return {
            line.rsplit(" ", 1)[0]
            for line in text.splitlines()
            if line.startswith(prefix) and not line.startswith("#")
        }

    deadline = time.monotonic() + 5.0
    while not any(name.startswith("gateway_prediction_window_inputs{") for name in names()):
        assert time.monotonic() < deadline, "the drift window's series did not appear"
        time.sleep(0.05)
    return names()


def png_with_private_chunks(count: int) -> bytes:
    """A valid PNG with ``count`` empty private chunks before its image data (header walk cost)."""
    real = small_png()
    header_end = 8 + 25  # signature + IHDR chunk
    filler = _chunk(b"prVt", b"") * count
    return real[:header_end] + filler + real[header_end:]


def jpeg_with_app_segments(count: int) -> bytes:
    """A valid JPEG with ``count`` extra empty APP9 segments after SOI (marker walk cost)."""
    real = chelsea_jpeg()
    return real[:2] + b"\xff\xe9\x00\x02" * count + real[2:]


class Answer(Protocol):
    """An HTTP answer as the tests read it: httpx's, and the test client's (httpx2)."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Any: ...
    @property
    def text(self) -> str: ...
    @property
    def content(self) -> bytes: ...
    def json(self) -> Any: ...


def load_script(path: Path, name: str) -> Any:
    """Import a script that is not part of a package (deploy/...) as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def running_prometheus(
    target_url: str,
    workdir: Path,
    rule_files: Sequence[Path] = (),
    scrape_interval: str = "1s",
    credentials_file: Path | None = None,
) -> Iterator[str]:
    """A real Prometheus (Debian's package) scraping ``target_url``'s /metrics, with exemplar
    storage on (as deploy/ runs it), with a bearer key read from ``credentials_file`` as
    deploy/prometheus/prometheus.yml does; yields its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: `make test` installs it (apt package prometheus)")
    port = free_port()
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": "triton-gateway",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [target_url.removeprefix("http://")]}],
                **(
                    {"authorization": {"type": "Bearer", "credentials_file": str(credentials_file)}}
                    if credentials_file
                    else {}
                ),
            }
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, (workdir / "prometheus.log").read_text()
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def tiny_classifier_onnx(
    path: Path,
    dims: Sequence[int | None] = (None, 3, 8, 8),
    classes: int = 3,
    *,
    inputs: int = 1,
) -> Path:
    """A real (tiny) ONNX image classifier: its logits are the mean of each channel
    (channel c's mean is class c's logit), then mapped to ``classes`` by a fixed matrix
    when that is not 3. ``dims``: the input's shape, None for a dynamic axis; the channel
    axis is the one of size 3 (NCHW or NHWC). ``inputs`` > 1 adds more image inputs."""
    import onnx
    from onnx import TensorProto, helper

    channels_last = dims[1] != 3
    spatial = [1, 2] if channels_last else [2, 3]
    names = [f"pixels{i}" if i else "pixels" for i in range(inputs)]
    shape = [d if d is not None else ("batch" if i == 0 else f"side{i}") for i, d in enumerate(dims)]
    graph_inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name in names]
    nodes = []
    source = names[0]
    for other in names[1:]:
        nodes.append(helper.make_node("Add", [source, other], [f"{other}_sum"]))
        source = f"{other}_sum"
    nodes.append(helper.make_node("ReduceMean", [source], ["means"], axes=spatial, keepdims=0))
    initializers = []
    if classes == 3:
        nodes.append(helper.make_node("Identity", ["means"], ["logits"]))
    else:
        weights = np.eye(3, classes, dtype=np.float32)
        initializers.append(helper.make_tensor("weights", TensorProto.FLOAT, [3, classes], weights.flatten()))
        nodes.append(helper.make_node("MatMul", ["means", "weights"], ["logits"]))
    batch = dims[0] if dims[0] is not None else "batch"
    output = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])
    graph = helper.make_graph(nodes, "tiny", graph_inputs, [output], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # readable by every ONNX Runtime our Triton env may have
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def processes_under(folder: Path) -> dict[int, str]:
    """Live (not zombie) processes whose command line names ``folder`` (a Triton's
    backends, its stubs, its keeper, a launcher's or a redis-server's workdir): PID ->
    command line. The suite's end check and the launcher tests share it."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(folder) in command and state != "Z":
            found[int(entry.name)] = command
    return found


PERF_INPUTS: dict[str, dict[str, object]] = {
    "image_classifier": {"IMAGE": "jpeg", "TOP_K": [3]},
    "text_classifier": {"TEXT": "The striker scored twice in the final.", "TOP_K": [2]},
}


def perf_analyzer_run(address: str, model: str, workdir: Path, protocol: str = "http") -> list[str]:
    """NVIDIA's perf_analyzer on ``model`` at ``address`` over ``protocol`` (concurrency 1
    and 2, a real JPEG or text): its "Concurrency:" lines (it must exit 0)."""
    from gateway.bench import perfanalyzer

    row = {
        name: perfanalyzer.bytes_input(chelsea_jpeg() if value == "jpeg" else str(value).encode())
        if isinstance(value, str) else value
        for name, value in PERF_INPUTS[model].items()
    }  # fmt: skip
    data = perfanalyzer.input_data(workdir / f"{model}-data.json", [row])
    command = [*perfanalyzer.command(), "-m", model, "-u", address, "-i", protocol, "--input-data", str(data),
               "--measurement-interval", "750", "--concurrency-range", "1:2", "--max-trials", "10",
               "--stability-percentage", "100"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if line.startswith("Concurrency:")]
