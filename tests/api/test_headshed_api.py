"""A classify request shed from its head (gateway/http/headshed.py, in the HTTP protocol: gateway/http/server.py) is answered, counted and
logged exactly as the route would refuse it: the same requests, sent to an app with the
layer and to one without it while the gateway sheds, get the same status, headers and body
(request ids aside) and move the same metric lines; and the layer really answers them
(the route never runs), except where the route must decide first."""

from __future__ import annotations

import gc
import json
import selectors
import socket
import time
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.http.dependencies import new_call
from gateway.http.headshed import HeadRefusal, HeadShed
from gateway.http.routes import classify as classify_routes
from gateway.http.routes import oip as oip_routes
from gateway.http.routes import openai as openai_routes
from gateway.http.routes.classify import classify_request
from gateway.serving.admission import Admission
from gateway.serving.refusal import Refusals
from gateway.settings import Settings
from gateway.shared.keyfiles import hash_key

from helpers.counters import Totals, moved, totals
from helpers.support import FakeBackend, ServedApp

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

REFUSES_UNREAD = Refusals.refuses
LIMIT = Admission.__dict__["limit"]
METRICS_LINE = (
    "gateway_requests_total",
    (("method", "GET"), ("model", ""), ("route", "/metrics"), ("status", "200")),
)
TEXT: dict[str, Any] = {"json": {"text": "The striker scored twice."}}
OIP: dict[str, Any] = {
    "json": {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["x"]}]}
}
TASK: dict[str, Any] = {"json": {"model": "text_classifier", "input": ["The striker scored twice."]}}
BODIES = {"/v2/": OIP, "/v1/": TASK}
PLAIN = {"x-api-key": "plain-secret"}
RATED = {"x-api-key": "rated-secret"}
# (url, headers, whether the head answers it)
CASES: list[tuple[str, dict[str, str], bool]] = [
    ("/classify", PLAIN, True),
    ("/classify?top_k=2", PLAIN, True),
    ("/models/text_classifier/classify", PLAIN, True),
    ("/models/text_classifier/versions/1/classify", {**PLAIN, "x-request-id": "mine-1"}, True),
    ("/classify", RATED, False),  # the route charges its rate first
    ("/classify", {}, False),  # no key: 401
    ("/classify", {"x-api-key": "wrong"}, False),
    ("/models/no_such_model/classify", PLAIN, False),  # 404 before 503
    ("/models/text_classifier/versions/99/classify", PLAIN, False),
    ("/classify?top_k=0", PLAIN, False),  # the framework's 422
    ("/v2/models/text_classifier/infer", PLAIN, True),  # the OIP door's
    ("/v2/models/image_classifier/versions/1/infer", PLAIN, True),
    ("/v2/models/text_classifier/infer", {**PLAIN, "x-request-id": "r" * 128}, True),  # the longest answer
    ("/v2/models/text_classifier/infer", RATED, False),
    ("/v2/models/no_such_model/infer", PLAIN, False),  # 404 before 503
    ("/v2/models/text_classifier/versions/x/infer", PLAIN, False),  # 400 before 503
    ("/v2/models/text_classifier/ready", PLAIN, False),  # not an inference
    ("/v1/classify", PLAIN, True),  # the task routes'
    ("/v1/embeddings", PLAIN, True),
    ("/v1/classify", RATED, False),
    ("/v1/models", PLAIN, False),  # not an inference (and a GET)
]


def _served(tmp_path: Path, head: bool) -> ServedApp:
    keys = tmp_path / f"keys-{head}"
    keys.write_text(f"plain {hash_key('plain-secret')}\nrated {hash_key('rated-secret')} 1000 1000\n")
    settings = Settings(auth={"keys_file": keys, "metrics_readers": []})  # any key reads /metrics
    app = create_app(settings, backend_factory=lambda *_: FakeBackend())
    if not head:  # the server reads it when it starts: every request goes the full path
        app.state.head_shed = None
    return ServedApp(app, settings).start()


@pytest.fixture
def shedding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every admission sheds from the headers: a full queue that moves too slowly."""
    monkeypatch.setattr(Refusals, "refuses", lambda self, tenant=None: True)
    monkeypatch.setattr(Admission, "limit", property(lambda self: 0))


@pytest.fixture
def route_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    ran: list[str] = []
    original = classify_request  # what the lane calls
    infer_request = oip_routes._infer  # what the OIP inference routes call

    async def spy(request: Any, *args: Any) -> Any:
        ran.append(request.url.path)
        return await original(request, *args)

    async def oip_spy(request: Any, *args: Any) -> Any:
        ran.append(request.url.path)
        return await infer_request(request, *args)

    def task_spy(request: Any, state: Any) -> Any:
        ran.append(request.url.path)
        return new_call(request, state)

    monkeypatch.setattr(classify_routes, "classify_request", spy)  # the lane is given it at build
    monkeypatch.setattr(oip_routes, "_infer", oip_spy)
    monkeypatch.setattr(openai_routes, "new_call", task_spy)  # what the task routes call first
    return ran


def _comparable(response: Any) -> tuple[int, dict[str, str], Any]:
    headers = {
        k: v for k, v in response.headers.items() if k not in ("x-request-id", "content-length", "date")
    }
    body = response.json()
    body.pop("request_id", None)
    return response.status_code, headers, body


def _lines(client: httpx.Client) -> Totals:
    text = client.get("/metrics", headers=PLAIN).text
    return totals(text, ("gateway_requests", "gateway_rejections", "gateway_client_requests"))


@pytest.mark.parametrize(("url", "headers", "at_head"), CASES, ids=[f"{u} {sorted(h)}" for u, h, _ in CASES])
def test_a_request_shed_from_its_head_is_answered_and_counted_as_the_route_would(
    tmp_path: Path,
    shedding: None,
    route_runs: list[str],
    url: str,
    headers: dict[str, str],
    at_head: bool,
) -> None:
    answers = []
    for head in (True, False):
        served = _served(tmp_path, head)
        try:
            with httpx.Client(base_url=served.url, timeout=10) as client:
                client.get("/metrics", headers=PLAIN)  # the /metrics line itself, counted before
                before = _lines(client)
                route_runs.clear()
                response = client.post(url, headers=headers, **BODIES.get(url[:4], TEXT))
                counted = moved(before, _lines(client))
        finally:
            served.stop()
        counted.pop(METRICS_LINE, None)
        answers.append((_comparable(response), counted, response.headers["x-request-id"], list(route_runs)))
    (with_head, moved_head, id_head, ran_head), (without, moved_route, id_route, ran_route) = answers
    assert with_head == without
    assert moved_head == moved_route
    if "x-request-id" in headers:
        assert id_head == id_route == headers["x-request-id"]
    if at_head:  # the route never ran behind the layer
        assert (ran_head, ran_route) == ([], [url.split("?")[0]])
        assert with_head[0] == 503
        assert with_head[2]["type"].endswith(":overloaded")
    else:  # the route (or what answers before it: 401, the framework's 422) answered
        assert ran_head == ran_route


def test_a_draining_gateway_refuses_at_the_head_as_the_route_does(
    tmp_path: Path, route_runs: list[str]
) -> None:
    answers = []
    for head in (True, False):
        served = _served(tmp_path, head)
        try:
            served.app.state.admission.start_draining()
            with httpx.Client(base_url=served.url, timeout=10) as client:
                answers.append(_comparable(client.post("/classify", headers=PLAIN, **TEXT)))
        finally:
            served.stop()
    assert answers[0] == answers[1]
    assert answers[0][0] == 503
    assert answers[0][1]["connection"] == "close"
    assert route_runs == ["/classify"]  # the app without the head's refusals only


def test_a_retry_at_once_is_held_and_the_connection_kept(
    tmp_path: Path, shedding: None, route_runs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On one kept-alive connection: a refusal, retries at once held (then refused), and,
    once the gateway sheds no more, the next request served on the same connection."""
    served = _served(tmp_path, True)
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            first = client.post("/classify", headers=PLAIN, **TEXT)
            started = time.monotonic()
            retries = [client.post("/classify", headers=PLAIN, **TEXT) for _ in range(3)]
            held = time.monotonic() - started  # 10, 20 and 40 ms (gateway.serving.retries)
            second = retries[-1]
            monkeypatch.setattr(Refusals, "refuses", REFUSES_UNREAD)
            monkeypatch.setattr(Admission, "limit", LIMIT)
            third = client.post("/classify", headers=PLAIN, **TEXT)
            connections = {
                r.extensions["network_stream"].get_extra_info("client_addr") for r in (first, third)
            }
    finally:
        served.stop()
    assert [first.status_code, second.status_code, third.status_code] == [503, 503, 200]
    assert "connection" not in first.headers
    assert "connection" not in second.headers
    assert [r.status_code for r in retries] == [503, 503, 503]
    assert held >= 0.065  # held, as the route holds them
    assert len(connections) == 1
    assert route_runs == ["/classify"]  # the third only


def test_a_refusal_from_the_head_is_freed_once_written_without_the_collector(
    tmp_path: Path, shedding: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal, and retries at once that are held (written from a timer), leave no
    reference cycle: each is freed when it is written, not when the garbage collector
    next walks its oldest generation. Before, the write scheduled itself from a closure
    (a cycle through the closure's cell) holding the refusal and its call scope: each
    refusal of a storm was left for the collector, as garbage it walks."""
    made: list[weakref.ref[HeadRefusal]] = []
    answer = HeadShed._answer

    def recorded(self: HeadShed, *args: Any) -> HeadRefusal:
        refusal = answer(self, *args)
        made.append(weakref.ref(refusal))
        return refusal

    monkeypatch.setattr(HeadShed, "_answer", recorded)
    served = _served(tmp_path, True)
    gc.disable()
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            statuses = [client.post("/classify", headers=PLAIN, **TEXT).status_code for _ in range(3)]
        time.sleep(0.1)  # (the server's loop is another thread's)
        alive = sum(ref() is not None for ref in made)
    finally:
        gc.enable()
        served.stop()
    assert statuses == [503, 503, 503]
    assert len(made) == 3  # the first at once, the two retries held
    assert alive == 0


def test_nothing_is_shed_at_the_head_while_the_queue_is_short(tmp_path: Path, route_runs: list[str]) -> None:
    served = _served(tmp_path, True)
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            assert client.post("/classify", headers=PLAIN, **TEXT).status_code == 200
    finally:
        served.stop()
    assert route_runs == ["/classify"]


def test_a_large_body_refused_at_the_head_is_closed_after_its_answer_is_read(
    tmp_path: Path, shedding: None, route_runs: list[str]
) -> None:
    """A body the server will not read away: the answer says ``Connection: close``, and
    the client still sending it reads the answer (the server lingers: gateway.http.server)."""
    served = _served(tmp_path, True)
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            head = (
                "POST /classify HTTP/1.1\r\nhost: x\r\nx-api-key: plain-secret\r\n"
                "content-type: application/json\r\ncontent-length: 8000000\r\n\r\n"
            )
            sock.sendall(head.encode() + b"{" + b" " * 1_000_000)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    finally:
        served.stop()
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 503 Service Unavailable"
    assert b"\r\nconnection: close\r\n" in rest.lower()
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["type"].endswith(":overloaded")
    assert route_runs == []


def test_requests_pipelined_behind_a_held_refusal_are_answered_in_order(
    tmp_path: Path, shedding: None, route_runs: list[str]
) -> None:
    """HTTP/1.1 pipelining: a refusal held at the head (a retry at once) is answered before
    the request sent behind it, which waits its turn as behind any other answer."""

    def request(request_id: str) -> bytes:
        body = json.dumps({"text": "The striker scored twice."}).encode()
        return (
            f"POST /classify HTTP/1.1\r\nhost: x\r\nx-api-key: plain-secret\r\nx-request-id: {request_id}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode() + body

    served = _served(tmp_path, True)
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(request("first"))
            answer = b""
            while b"first" not in answer or not answer.endswith(b"}"):
                answer += sock.recv(65536)
            sock.sendall(request("held") + request("behind"))  # the second is held 10 ms
            answer = b""
            while answer.count(b"HTTP/1.1 503") < 2 or not answer.endswith(b"}"):
                chunk = sock.recv(65536)
                assert chunk, answer
                answer += chunk
    finally:
        served.stop()
    ids = [line.split(b": ")[1] for line in answer.split(b"\r\n") if line.lower().startswith(b"x-request-id")]
    assert ids == [b"held", b"behind"]


def test_a_storm_of_heads_parsed_in_one_turn_sees_those_ahead_of_it(
    tmp_path: Path, route_runs: list[str]
) -> None:
    """Issue 54's upload storm, in one turn of the event loop: the heads of many uploads
    from one key are parsed before any of their routes runs. Each head counts as its key's
    upload from then on (gateway.serving.refusal's ``arrived``), so those beyond what the
    gateway serves within the queue wait are refused at the head, the route never run;
    before, every route ran (nothing was uploading yet when the heads were judged), and
    the routes refused them, each through the framework."""
    keys = tmp_path / "keys"
    keys.write_text(f"plain {hash_key('plain-secret')}\n")
    settings = Settings(
        auth={"keys_file": keys, "metrics_readers": []},
        server={"max_in_flight": 2, "queue_seconds": 0.01, "adaptive": {"enabled": False}},
    )
    served = ServedApp(create_app(settings, backend_factory=lambda *_: FakeBackend()), settings).start()
    count = 12
    sockets: list[socket.socket] = []
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            for _ in range(4):  # the gateway has seen its queue move
                assert client.post("/classify", headers=PLAIN, **TEXT).status_code == 200
        route_runs.clear()
        head = (
            b"POST /classify HTTP/1.1\r\nhost: x\r\nx-api-key: plain-secret\r\n"
            b"content-type: image/jpeg\r\ncontent-length: 300000\r\n\r\n"
        )
        sockets = [socket.create_connection(("127.0.0.1", served.port), timeout=10) for _ in range(count)]
        time.sleep(0.2)  # all accepted
        assert served._loop is not None
        served._loop.call_soon_threadsafe(time.sleep, 0.5)  # the loop is busy while the heads come
        time.sleep(0.1)
        for sock in sockets:
            sock.sendall(head)  # the bodies never come: the admitted ones are uploading
        answers: list[bytes] = []  # the two admitted wait for their bodies: no answer
        with selectors.DefaultSelector() as selector:
            for sock in sockets:
                selector.register(sock, selectors.EVENT_READ)
            deadline = time.monotonic() + 3
            while len(answers) < count - 2 and time.monotonic() < deadline:
                for key, _ in selector.select(timeout=0.2):
                    selector.unregister(key.fileobj)
                    answers.append(key.fileobj.recv(200).split(b"\r\n", 1)[0])  # type: ignore[union-attr]
            time.sleep(0.2)
            answers += [key.fileobj.recv(200)[:12] for key, _ in selector.select(timeout=0)]  # type: ignore[union-attr]
    finally:
        for sock in sockets:
            sock.close()
        served.stop()
    print(f"{count} heads in one turn: routes run {len(route_runs)}; answers {Counter(answers)}")
    assert answers == [b"HTTP/1.1 503 Service Unavailable"] * (count - 2)
    assert len(route_runs) == 2, route_runs  # the two in the limit; before: all twelve
