"""The two doors, differentially: the same cases sent to ``/v2`` (HTTP) and to the gRPC
door of one gateway in front of the real Triton, with the outcome compared case by case:
the status (and the gRPC code it maps to), the request id given back, the metric lines
(``gateway_requests_total``, ``gateway_rejections_total``), the access-log line and the
prediction-log record. A difference between the doors is a failure, whatever the case.

Cases: an answer; no key; a wrong key; a key past its rate; a key whose quota is spent;
an unknown model; an unknown version; a version that is not a number; bad tensors; a text
over the caps; a client that gives up while its request is read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.http as thttp
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway.dev.tritonserver import TritonServer, free_port
from gateway.rpc.service import STATUS_CODES
from gateway.settings import Settings
from gateway.shared.keyfiles import hash_key

from helpers.counters import Totals, moved, totals
from helpers.support import chelsea_jpeg
from helpers.triton_fixtures import gateway_settings

V2_ROUTE = {
    "": "/v2/models/{model_name}/infer",
    "v": "/v2/models/{model_name}/versions/{model_version}/infer",
}
GRPC_ROUTE = "/inference.GRPCInferenceService/ModelInfer"
TEXTS = ["The striker scored twice in the final.", "The central bank raised interest rates again."]
DOORS = ("http", "grpc")


@dataclass
class Stack:
    http: httpx.Client
    grpc_address: str
    log: Path


@dataclass(frozen=True)
class Case:
    """One request, as both doors send it: the key (per door: the stateful keys are one
    per door), the model, version and tensors (``top_k_type``: TOP_K's datatype)."""

    name: str
    key: str | None = "app"
    model: str = "text_classifier"
    version: str = ""
    texts: tuple[str, ...] = tuple(TEXTS)
    top_k_type: str = "INT32"
    warm: int = 0  # calls made first (a rate or a quota to spend)
    image: bool = False  # one image to image_classifier instead of the texts


@dataclass
class Outcome:
    status: int  # HTTP status, or the gRPC code's
    code: str  # the gRPC code ("" on HTTP)
    request_id: str
    detail: str
    answer: dict[str, Any] | None = None


KEYS = {
    "app": "app-secret",
    "slow-http": "slow-http-secret",
    "slow-grpc": "slow-grpc-secret",
    "capped-http": "capped-http-secret",
    "capped-grpc": "capped-grpc-secret",
    "pictures-http": "pictures-http-secret",
    "pictures-grpc": "pictures-grpc-secret",
    "shed-http": "shed-http-secret",
    "shed-grpc": "shed-grpc-secret",
}


@pytest.fixture(scope="module")
def stack(triton: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from gateway.app import create_app

    from helpers.support import ServedApp

    folder = tmp_path_factory.mktemp("parity")
    keys = folder / "keys"
    keys.write_text(
        f"app {hash_key(KEYS['app'])}\n"
        f"slow-http {hash_key(KEYS['slow-http'])} 0.01 1\n"
        f"slow-grpc {hash_key(KEYS['slow-grpc'])} 0.01 1\n"
        f"capped-http {hash_key(KEYS['capped-http'])} quota=1/day\n"
        f"capped-grpc {hash_key(KEYS['capped-grpc'])} quota=1/day\n"
        f"pictures-http {hash_key(KEYS['pictures-http'])} image-quota=1/day\n"
        f"pictures-grpc {hash_key(KEYS['pictures-grpc'])} image-quota=1/day\n"
        f"shed-http {hash_key(KEYS['shed-http'])}\n"
        f"shed-grpc {hash_key(KEYS['shed-grpc'])}\n"
    )
    log = folder / "predictions.jsonl"
    port = free_port()
    settings: Settings = gateway_settings(
        triton,
        auth={"keys_file": keys, "protect_metrics": False},
        grpc={"port": port, "host": "127.0.0.1"},
        prediction_log={"url": f"file://{log}", "sample_rate": 1.0, "failure_sample_rate": 1.0},
        server={"body_timeout_seconds": 3},
    )
    served = ServedApp(create_app(settings), settings).start()
    with httpx.Client(base_url=served.url, timeout=30) as http:
        yield Stack(http, f"127.0.0.1:{port}", log)
    served.stop()


def _key(case: Case, door: str) -> str | None:
    if case.key is None:
        return None
    if case.key == "wrong":
        return "not-a-key"
    name = case.key if case.key == "app" else f"{case.key}-{door}"
    return KEYS[name]


def _top_k(case: Case) -> np.ndarray:
    return np.full((len(case.texts), 1), 3, dtype=np.float32 if case.top_k_type == "FP32" else np.int32)


def _send_http(stack: Stack, case: Case, request_id: str) -> Outcome:
    headers = {"x-request-id": request_id}
    key = _key(case, "http")
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    body = {
        "inputs": [
            {"name": "TEXT", "datatype": "BYTES", "shape": [len(case.texts), 1], "data": list(case.texts)},
            {
                "name": "TOP_K",
                "datatype": case.top_k_type,
                "shape": [len(case.texts), 1],
                "data": _top_k(case).reshape(-1).tolist(),
            },
        ]
    }
    path = f"/v2/models/{case.model}" + (f"/versions/{case.version}" if case.version else "") + "/infer"
    if case.image:
        content, length = _image_body()
        headers["inference-header-content-length"] = str(length)
        response = stack.http.post(path, content=content, headers=headers)
    else:
        response = stack.http.post(path, json=body, headers=headers)
    document = response.json()
    answer = None
    if response.status_code == 200:
        answer = {o["name"]: o["data"] for o in document["outputs"]}
        answer["model"], answer["version"] = document["model_name"], document["model_version"]
    return Outcome(
        response.status_code, "", response.headers["x-request-id"], document.get("error", ""), answer
    )


def _image_body() -> tuple[bytes, int]:
    """One JPEG and its TOP_K in the binary tensor extension (JSON strings cannot hold an
    image), as tritonclient.http builds it: the body and its JSON header's length."""
    image = thttp.InferInput("IMAGE", [1, 1], "BYTES")
    image.set_data_from_numpy(np.array([[chelsea_jpeg()]], dtype=np.object_), binary_data=True)
    top_k = thttp.InferInput("TOP_K", [1, 1], "INT32")
    top_k.set_data_from_numpy(np.array([[3]], dtype=np.int32), binary_data=False)
    outputs = [
        thttp.InferRequestedOutput(name, binary_data=False) for name in ("LABELS", "SCORES", "CLASS_IDS")
    ]
    body, length = thttp.InferenceServerClient.generate_request_body([image, top_k], outputs=outputs)
    return body, length or 0


def _grpc_request(case: Case) -> Any:
    request = service_pb2.ModelInferRequest(model_name=case.model, model_version=case.version)
    if case.image:
        image = request.inputs.add(name="IMAGE", datatype="BYTES", shape=[1, 1])
        image.contents.bytes_contents.append(chelsea_jpeg())
        top_k = request.inputs.add(name="TOP_K", datatype="INT32", shape=[1, 1])
        top_k.contents.int_contents.append(3)
        return request
    text = request.inputs.add(name="TEXT", datatype="BYTES", shape=[len(case.texts), 1])
    text.contents.bytes_contents.extend(t.encode() for t in case.texts)
    top_k = request.inputs.add(name="TOP_K", datatype=case.top_k_type, shape=[len(case.texts), 1])
    if case.top_k_type == "FP32":
        top_k.contents.fp32_contents.extend(_top_k(case).reshape(-1).tolist())
    else:
        top_k.contents.int_contents.extend(_top_k(case).reshape(-1).tolist())
    return request


def _send_grpc(stack: Stack, case: Case, request_id: str) -> Outcome:
    metadata = [("x-request-id", request_id)]
    key = _key(case, "grpc")
    if key is not None:
        metadata.append(("authorization", f"Bearer {key}"))
    with grpc.insecure_channel(stack.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            response, call = stub.ModelInfer.with_call(_grpc_request(case), metadata=metadata, timeout=30)
        except grpc.RpcError as error:
            given = dict(error.trailing_metadata() or ())
            code = error.code()
            return Outcome(0, code.name, given.get("x-request-id", ""), error.details() or "")
    given = dict(call.trailing_metadata())
    answer: dict[str, Any] = {}
    for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        if output.datatype == "BYTES":
            items, at = [], 0
            while at < len(raw):
                size = int.from_bytes(raw[at : at + 4], "little")
                items.append(raw[at + 4 : at + 4 + size].decode())
                at += 4 + size
            answer[output.name] = items
        else:
            dtype = {"FP32": np.float32, "INT32": np.int32, "BOOL": np.bool_}[output.datatype]
            answer[output.name] = np.frombuffer(raw, dtype=dtype).tolist()
    answer["model"], answer["version"] = response.model_name, response.model_version
    return Outcome(200, "OK", given.get("x-request-id", ""), "", answer)


def _counters(stack: Stack) -> Totals:
    return totals(stack.http.get("/metrics").text, ("gateway_requests", "gateway_rejections"))


def _neutral(delta: dict[Any, float], route: str, unread: bool = False) -> dict[Any, float]:
    """The counts with the door's own route and method taken out (what both must share);
    ``unread``: and the model (a call refused before its message is read names none)."""
    varies = ("route", "method", "model") if unread else ("route", "method")
    out: dict[Any, float] = {}
    for (name, labels), value in delta.items():
        kept = tuple((k, v) for k, v in labels if k not in varies)
        routes = [v for k, v in labels if k == "route"]
        if routes and routes[0] != route:
            continue  # the /metrics scrape itself, say
        out[(name, kept)] = out.get((name, kept), 0.0) + value
    return out


def _records(stack: Stack, request_id: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = []
        if stack.log.exists():
            found = [
                r
                for r in map(json.loads, stack.log.read_text().splitlines())
                if r["request_id"] == request_id
            ]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


CASES = [
    Case("answer"),
    Case("no key", key=None),
    Case("wrong key", key="wrong"),
    Case("rate-limited", key="slow", warm=1),
    Case("quota spent", key="capped", warm=1),
    Case("image quota spent", key="pictures", model="image_classifier", image=True, warm=1),
    Case("unknown model", model="no_such_model"),
    Case("unknown version", version="9"),
    Case("version not a number", version="abc"),
    Case("bad tensors", top_k_type="FP32"),
    Case("too large", texts=("x" * 12_000,)),
    Case("overloaded", key="shed"),
]
# the doors' statuses for each case (the gRPC code is the map's, checked beside)
EXPECTED = {
    "answer": (200, "OK"),
    "no key": (401, "UNAUTHENTICATED"),
    "wrong key": (401, "UNAUTHENTICATED"),
    "rate-limited": (429, "RESOURCE_EXHAUSTED"),
    "quota spent": (429, "RESOURCE_EXHAUSTED"),
    "image quota spent": (429, "RESOURCE_EXHAUSTED"),
    "unknown model": (404, "NOT_FOUND"),
    "unknown version": (404, "NOT_FOUND"),
    "version not a number": (404, "INVALID_ARGUMENT"),  # Triton's codes on each door
    "bad tensors": (422, "INVALID_ARGUMENT"),
    "too large": (413, "INVALID_ARGUMENT"),
    "overloaded": (503, "UNAVAILABLE"),
}
# refused before the message is read: the gRPC door cannot know the model the message
# names (HTTP reads it from the path), so the model is left out of what is compared
UNREAD = {"overloaded"}


def _shed_the_shed_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Overload, as the one rule every door asks decides it (gateway.serving.refusal), for
    the ``shed`` keys only: a real overload cannot be had on demand for one request of
    each door, and what is compared here is what each door does with the decision."""
    from gateway.serving.refusal import Refusals

    real = Refusals.refuses

    def refuses(self: Refusals, tenant: Any = None) -> bool:
        if tenant is not None and tenant.id.startswith("shed-"):
            return True
        return real(self, tenant) if tenant is not None else real(self)

    monkeypatch.setattr(Refusals, "refuses", refuses)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_both_doors_end_a_case_alike(
    stack: Stack, case: Case, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    if case.key == "shed":
        _shed_the_shed_keys(monkeypatch)
    outcomes: dict[str, Outcome] = {}
    counted: dict[str, dict[Any, float]] = {}
    lines: dict[str, list[tuple[str, int, str]]] = {}
    logged: dict[str, list[dict[str, Any]]] = {}
    slug = case.name.replace(" ", "-")
    for door, send in (("http", _send_http), ("grpc", _send_grpc)):
        for index in range(case.warm):
            send(stack, case, f"warm-{slug}-{door}-{index}")
        request_id = f"parity-{slug}-{door}"
        before = _counters(stack)
        outcomes[door] = send(stack, case, request_id)
        route = V2_ROUTE["v" if case.version else ""] if door == "http" else GRPC_ROUTE
        time.sleep(0.05)  # the outcome is recorded as the call ends, after its answer left
        counted[door] = _neutral(moved(before, _counters(stack)), route, case.name in UNREAD)
        assert outcomes[door].request_id == request_id, f"{door} gave back another request id"
        lines[door] = [
            (r.route, r.status, r.model)  # type: ignore[attr-defined]
            for r in caplog.records
            if getattr(r, "request_id", None) == request_id
        ]
        # refused before the model (no key, its rate, its quota): no record is expected, so
        # the wait for one is short on both doors (HTTP's waited the full 10 s: 4 x 8.5 s)
        refused_early = outcomes[door].status in (401, 429) or outcomes[door].code in (
            "UNAUTHENTICATED",
            "RESOURCE_EXHAUSTED",
        )
        logged[door] = _records(stack, request_id, timeout=1.5 if refused_early else 10)

    http, rpc = outcomes["http"], outcomes["grpc"]
    assert (http.status, rpc.code) == EXPECTED[case.name], (http, rpc)
    assert http.detail == rpc.detail, "the doors explain the refusal differently"
    assert http.answer == rpc.answer
    # one access-log line each, with the same status and model (the route is the door's)
    route = V2_ROUTE["v" if case.version else ""]
    assert lines["http"] == [(route, http.status, lines["http"][0][2])]
    model = "" if case.name in UNREAD else lines["http"][0][2]
    assert lines["grpc"] == [(GRPC_ROUTE, http.status, model)]
    assert counted["http"] == counted["grpc"], "the doors count the case differently"
    assert any(name == "gateway_requests_total" for name, _ in counted["http"])
    # the prediction log: the same record from each door (but the route and the timings)
    assert len(logged["http"]) == len(logged["grpc"]) <= 1
    for record in (*logged["http"], *logged["grpc"]):
        for varies in ("route", "latency_seconds", "time", "request_id", "trace_id"):
            record.pop(varies, None)
        if case.name in UNREAD:
            record.pop("model", None)
        if record["client"]:  # the stateful keys are one per door
            record["client"] = record["client"].removesuffix("-http").removesuffix("-grpc")
    assert logged["http"] == logged["grpc"]
    if case.name == "answer":
        [record] = logged["http"]
        # each text, and the TOP_K tensor
        assert (record["model"], record["status"], len(record["inputs"])) == ("text_classifier", 200, 3)
        assert [p["label"] for p in record["predictions"][0]] == http.answer["LABELS"][:3]  # type: ignore[index]


def test_the_grpc_code_of_each_case_is_the_status_maps() -> None:
    """What the table above says of the gRPC side follows from the HTTP status (the one
    exception, a version that is not a number, is Triton's own code on each door)."""
    for name, (status, code) in EXPECTED.items():
        if status != 200 and name != "version not a number":
            assert STATUS_CODES[status].name == code, name


@contextlib.contextmanager
def _http_body_unsent(stack: Stack, headers: bytes = b"") -> Iterator[socket.socket]:
    """A ``/v2`` inference whose head and a part of its body are sent, the rest never."""
    host, port = stack.http.base_url.host, stack.http.base_url.port
    with socket.create_connection((host, port)) as sock:
        sock.sendall(
            b"POST /v2/models/text_classifier/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {KEYS['app']}\r\n".encode()
            + headers
            + b'content-length: 100000\r\n\r\n{"inputs": ['
        )
        yield sock


@contextlib.contextmanager
def _grpc_message_unsent(stack: Stack, request_id: str | None = None) -> Iterator[Any]:
    """A ``ModelInfer`` call started whose message never comes; cancelled on the way out."""
    metadata = [("authorization", f"Bearer {KEYS['app']}")]
    if request_id is not None:
        metadata.append(("x-request-id", request_id))
    with grpc.insecure_channel(stack.grpc_address) as channel:
        stop = threading.Event()

        def never() -> Iterator[bytes]:
            stop.wait(10)
            return
            yield b""

        call = channel.stream_unary(GRPC_ROUTE).future(never(), metadata=metadata)
        try:
            yield call
        finally:
            call.cancel()
            stop.set()


def test_a_client_that_gives_up_is_499_on_both_doors(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    """Each door's client sends part of its request and goes away: counted as 499 on both
    (never a success, never the gateway's 500), with one access-log line each."""
    caplog.set_level(logging.INFO, logger="gateway.access")
    before = _counters(stack)
    # HTTP: a head and a part of its body, then the connection is closed
    with _http_body_unsent(stack, b"x-request-id: gone-http\r\n"):
        time.sleep(0.3)
    # gRPC: the call starts, its message never comes, the client cancels
    with _grpc_message_unsent(stack, "gone-grpc"):
        time.sleep(0.3)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = {
            r.__dict__["request_id"]: r.__dict__["status"]
            for r in caplog.records
            if getattr(r, "request_id", "").startswith("gone-")
        }
        if len(lines) == 2:
            break
        time.sleep(0.05)
    assert lines == {"gone-http": 499, "gone-grpc": 499}
    delta = moved(before, _counters(stack))
    statuses = {
        dict(labels)["route"]: dict(labels)["status"]
        for (name, labels), _ in delta.items()
        if name == "gateway_requests_total"
    }
    assert statuses[V2_ROUTE[""]] == "499"
    assert statuses[GRPC_ROUTE] == "499"


def _in_flight(stack: Stack) -> float:
    """``gateway_requests_in_flight`` less the /metrics request reading it."""
    text = stack.http.get("/metrics").text
    line = next(line for line in text.splitlines() if line.startswith("gateway_requests_in_flight "))
    return float(line.split()[1]) - 1


def test_a_call_under_way_is_in_flight_on_both_doors(stack: Stack) -> None:
    """One call scope beneath both doors (gateway.serving.scope): a call whose message is
    still to come counts in ``gateway_requests_in_flight`` on either door, and leaves it
    when it ends."""
    idle = _in_flight(stack)
    with _http_body_unsent(stack), _grpc_message_unsent(stack):
        deadline = time.monotonic() + 2  # (the body's timeout is 3 s)
        while (held := _in_flight(stack)) < idle + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert held == idle + 2
    deadline = time.monotonic() + 5
    while (after := _in_flight(stack)) != idle and time.monotonic() < deadline:
        time.sleep(0.05)
    assert after == idle


def test_every_door_gives_the_callers_request_id_back_or_a_new_one(stack: Stack) -> None:
    answer = _send_grpc(stack, Case("answer"), "mine-123")
    assert answer.request_id == "mine-123"
    refused = _send_grpc(stack, Case("no key", key=None), "mine-456")
    assert refused.request_id == "mine-456"
    made = _send_grpc(stack, Case("answer"), "not valid!")
    assert made.request_id
    assert made.request_id != "not valid!"


Send = Callable[[Stack, Case, str], Outcome]
