"""An adversary that walks every door: every HTTP route the app serves (from its own
route table, the admin surface included) and every method of Triton's gRPC service (from
its descriptor), for each kind of caller (none, a bad key, and limited to one model: a key,
a token from a real OpenID provider, a certificate a trusted proxy forwards), against a
real gateway in front of the real Triton. A route or method added without the
front door's rules fails here:

- a caller that is not known is refused before its body is read: the answer comes while
  not one body byte has been sent (HTTP), or while no message has been sent (gRPC);
- an answer given with the body unread ends within its bound: one byte after it, then
  silence, and the connection is closed within ``linger_seconds``;
- a model the key may not use answers exactly as a model that does not exist;
- nothing a caller sends gets a 5xx (HTTP) or INTERNAL/UNKNOWN (gRPC).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from tritonclient.grpc import service_pb2

from gateway.app import create_app, openapi_document
from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer, free_port
from gateway.http.paths import ALWAYS_OPEN
from gateway.settings import Settings
from gateway.shared.keyfiles import hash_key

from helpers.oidc import AUDIENCE, OidcProvider

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

LINGER = 2.0
SERVICE = "inference.GRPCInferenceService"
FULL, LIMITED, ADMIN = "full-secret", "texts-secret", "admin-secret"
# the documentation routes: open unless configured protected (auth.protect_docs)
DOCS = [("/docs", "GET"), ("/redoc", "GET"), ("/openapi.json", "GET")]
OPEN = ALWAYS_OPEN | {path for path, _ in DOCS}
# Triton's and OpenAI's protocols answer errors in their own JSON shapes, which their
# clients read (gateway.http.problems); every other route in problem+json
PROTOCOL_PREFIXES = ("/v2", "/v1/")


def _routes() -> list[tuple[str, str]]:
    """Every (path template, method) the gateway serves, admin surface included: from
    the app's own route table, as the operators' reference document lists it."""
    settings = Settings()
    app = create_app(settings)
    app.state.admin_included = True  # the admin routes' templates, as a gateway with admin keys serves them
    paths = openapi_document(app, settings, admin=True)["paths"]
    routes = [(path, method.upper()) for path, operations in paths.items() for method in operations]
    assert any(path.startswith("/admin/") for path, _ in routes), "the admin surface is walked too"
    assert len(routes) >= 25, routes
    return routes + DOCS


def _concrete(template: str, model: str = "text_classifier") -> str:
    path = re.sub(r"\{(model|model_name|name)\}", model, template)
    return re.sub(r"\{[a-z_]+\}", "1", path)


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    provider = OidcProvider(
        tmp_path_factory.mktemp("every-door-idp"), clients={"texts": {"models": ["text_classifier"]}}
    )
    provider.start()
    yield provider
    provider.stop()


@pytest.fixture(scope="module")
def door(
    triton: TritonServer, tmp_path_factory: pytest.TempPathFactory, provider: OidcProvider
) -> Iterator[tuple[GatewayProcess, str]]:
    folder = tmp_path_factory.mktemp("every-door")
    keys = folder / "keys"
    keys.write_text(
        f"full {hash_key(FULL)}\ntexts {hash_key(LIMITED)} models=text_classifier\n"
        "cert:lab - models=text_classifier\n"
    )
    issuer = {"issuer": provider.issuer, "audience": AUDIENCE, "models_claim": "models", "name": "idp"}
    admin = folder / "admin-keys"
    admin.write_text(f"operator {hash_key(ADMIN)}\n")
    port = free_port()
    gateway = GatewayProcess.start(
        triton,
        folder,
        env={
            "GATEWAY_AUTH__KEYS_FILE": str(keys),
            "GATEWAY_ADMIN__KEYS_FILE": str(admin),
            "GATEWAY_GRPC__PORT": str(port),
            "GATEWAY_GRPC__HOST": "127.0.0.1",
            "GATEWAY_SERVER__LINGER_SECONDS": str(LINGER),
            "GATEWAY_AUTH__OIDC": json.dumps([issuer]),
            # a proxy on this host forwards verified certificates (Envoy's XFCC)
            "GATEWAY_AUTH__TRUSTED_PROXIES": '["127.0.0.1/32"]',
        },
    ).wait()
    yield gateway, f"127.0.0.1:{port}"
    gateway.stop()


def _head(path: str, method: str, key: str | None) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: x",
        "Content-Type: application/json",
        "Content-Length: 1000000",
    ]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _walk(port: int, path: str, method: str, key: str | None) -> tuple[int, bytes, float | None]:
    """The status and head of the answer to a request whose 1 MB body is never sent, and
    when the connection closed after one body byte and silence (None: still open)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_head(path, method, key))
        sock.settimeout(5)  # the answer must come with no body byte sent
        answer = b""
        while b"\r\n\r\n" not in answer:
            piece = sock.recv(65536)
            if not piece:
                break
            answer += piece
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
        try:
            sock.sendall(b"{")
        except OSError:
            return status, answer, 0.0
        started = time.monotonic()
        sock.settimeout(0.2)
        while time.monotonic() - started < LINGER + 3:
            try:
                if sock.recv(65536) == b"":
                    return status, answer, time.monotonic() - started
            except TimeoutError:
                continue
            except OSError:
                return status, answer, time.monotonic() - started
        return status, answer, None


@pytest.mark.parametrize("key", [None, "not-a-key"], ids=["no-key", "bad-key"])
def test_every_route_refuses_an_unknown_caller_unread_and_lets_go_of_it(
    door: tuple[GatewayProcess, str], key: str | None
) -> None:
    gateway, _ = door
    routes = _routes()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda r: _walk(gateway.port, _concrete(r[0]), r[1], key), routes))
    problems = []
    for (template, method), (status, head, closed) in zip(routes, results, strict=True):
        where = f"{method} {template}"
        if status == 0:
            problems.append(f"{where}: no answer before its body (got {head[:60]!r})")
            continue
        if status >= 500 and not (template in OPEN and status == 503):
            problems.append(f"{where}: {status}")
        if template not in OPEN and status != 401:
            problems.append(f"{where}: {status}, not 401, for an unknown caller")
        shape = b"application/json" if template.startswith(PROTOCOL_PREFIXES) else b"application/problem+json"
        if status >= 400 and b"content-type: " + shape not in head.lower():
            problems.append(f"{where}: {status} is not {shape.decode()}")
        if closed is None or closed > LINGER + 1.5:
            problems.append(f"{where}: still open {closed} s after its answer and one body byte")
    assert not problems, "\n".join(problems)


def _oversized(port: int, path: str, method: str) -> tuple[int, bytes, float | None]:
    """The answer to a head that goes on past the cap (70 KiB of headers, never ended),
    and how long the connection stays once the client has read it and sent its FIN."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: x\r\n".encode() + (b"X-Filler: " + b"a" * 1000 + b"\r\n") * 70
        )
        sock.settimeout(5)
        answer = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in answer and (piece := sock.recv(65536)):
                answer += piece
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
        started = time.monotonic()
        try:
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except TimeoutError:
            return status, answer, None
        except OSError:
            pass
        return status, answer, time.monotonic() - started


def test_every_route_answers_a_head_past_the_cap_with_a_431_and_lets_go(
    door: tuple[GatewayProcess, str],
) -> None:
    """server.max_head_bytes is the protocol's, before any route: every route (and a path
    no route serves) answers 431 in its door's error form, and lets the socket go."""
    gateway, _ = door
    routes = [*_routes(), ("/no/such/route", "GET")]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda r: _oversized(gateway.port, _concrete(r[0]), r[1]), routes))
    problems = []
    for (template, method), (status, head, closed) in zip(routes, results, strict=True):
        where = f"{method} {template}"
        if status != 431:
            problems.append(f"{where}: {status or head[:60]!r}, not 431")
            continue
        shape = b"application/json" if template.startswith(PROTOCOL_PREFIXES) else b"application/problem+json"
        if b"content-type: " + shape + b"\r\n" not in head.lower():
            problems.append(f"{where}: its 431 is not {shape.decode()}")
        if closed is None or closed > 1.0:
            problems.append(f"{where}: open {closed} s after its answer and the client's FIN")
    assert not problems, "\n".join(problems)


LIVEZ = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"


def _framed_answers(wire: bytes) -> list[tuple[int, bytes]]:
    """The whole answers at the start of ``wire``: (status, head), each framed by its
    Content-Length or its chunks."""
    answers = []
    at = 0
    while (end := wire.find(b"\r\n\r\n", at)) >= 0:
        head = wire[at:end]
        fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
        if fields.get(b"transfer-encoding") == b"chunked":
            last = wire.find(b"\r\n0\r\n\r\n", end)
            if last < 0:
                break
            at = last + 7
        else:
            at = end + 4 + int(fields.get(b"content-length", b"0"))
            if at > len(wire):
                break
        answers.append((int(head.split(b" ", 2)[1]), head))
    return answers


def _pipelined(port: int, path: str, method: str, key: str | None) -> tuple[list[tuple[int, bytes]], bool]:
    """Two ``GET /livez``, the route's request and ``GET /livez`` pipelined on one
    connection, the route's small JSON body cut after its first byte with a pause: the
    answers, and whether the connection closed after them."""
    body = b'{"a": 1}' if method != "GET" else b""
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: x",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    cut = len(request) - len(body) + min(len(body), 1)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(LIVEZ * 2 + request[:cut])
        time.sleep(0.05)
        sock.sendall(request[cut:] + LIVEZ)
        sock.settimeout(5)
        wire, closed = b"", False
        with contextlib.suppress(TimeoutError):
            while len(_framed_answers(wire)) < 4:
                try:
                    piece = sock.recv(65536)
                except ConnectionResetError:  # the last request sent after a close: the
                    piece = b""  # kernel resets; the answers before it were read first
                if not piece:
                    closed = True
                    break
                wire += piece
        return _framed_answers(wire), closed


@pytest.mark.parametrize("key", [None, "not-a-key"], ids=["no-key", "bad-key"])
def test_every_route_pipelined_between_requests_is_answered_in_order(
    door: tuple[GatewayProcess, str], key: str | None
) -> None:
    """Each route's request pipelined behind two ``GET /livez`` and before a third, on one
    connection, its body still arriving when the first is answered: four answers in that
    order, none a 5xx, the livez ones 200; or, if the route's answer closes the connection
    (``Connection: close``), three and then the close. A guarantee of the protocol, held
    on every route: before 13746b4, the requests behind the first were never answered on
    every route with a body (the pipelining fuzzer of the attack suite found it)."""
    gateway, _ = door
    routes = [*_routes(), ("/no/such/route", "GET")]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda r: _pipelined(gateway.port, _concrete(r[0]), r[1], key), routes))
    problems = []
    for (template, method), (answers, closed) in zip(routes, results, strict=True):
        where = f"{method} {template}"
        statuses = [status for status, _ in answers]
        if len(answers) < 3 or statuses[:2] != [200, 200]:
            problems.append(f"{where}: answered {statuses}")
            continue
        status, head = answers[2]
        if status >= 500 and not (template in OPEN and status == 503):
            problems.append(f"{where}: {status}")
        if b"\r\nconnection: close" in head.lower():
            if len(answers) != 3 or not closed:
                problems.append(f"{where}: {statuses} after Connection: close, closed: {closed}")
        elif statuses[3:] != [200]:
            problems.append(f"{where}: answered {statuses}, the last request's lost")
    assert not problems, "\n".join(problems)


def _tiny_chunks(port: int, path: str, method: str) -> tuple[int, bytes, float | None]:
    """The answer to a head with a chunked body of 20,000 1-byte chunks sent at once, and
    how long the gateway keeps the socket after it (None: still open after 3 s; the
    client sends no FIN)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        with contextlib.suppress(OSError):
            sock.sendall(
                f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n".encode()
                + b"1\r\na\r\n" * 20_000
            )
        sock.settimeout(3)
        answer = b""
        try:
            while piece := sock.recv(65536):
                answer += piece
            closed: float | None = time.monotonic() - started
        except TimeoutError:
            closed = None
        except OSError:
            closed = time.monotonic() - started
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
        return status, answer, closed


def test_every_route_stops_parsing_a_body_of_tiny_chunks_and_lets_go(
    door: tuple[GatewayProcess, str],
) -> None:
    """server.min_chunk_bytes is the protocol's, before any route: a body of 1-byte chunks
    (each a step of the parser's) to every route, and a path none serves, is answered
    (a 400, or what the route answers before reading a body) and its socket let go within
    a second, the rest never parsed. Before, a route that answered first read the rest
    away, chunk by chunk, for the linger bound."""
    gateway, _ = door
    routes = [*_routes(), ("/no/such/route", "POST")]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda r: _tiny_chunks(gateway.port, _concrete(r[0]), r[1]), routes))
    problems = []
    for (template, method), (status, answer, closed) in zip(routes, results, strict=True):
        where = f"{method} {template}"
        if not 200 <= status < 500 and not (template in OPEN and status == 503):
            problems.append(f"{where}: {status or answer[:60]!r}")
        if answer.count(b"HTTP/1.1 ") > 1:
            problems.append(f"{where}: more than one answer")
        if closed is None or closed > 1.0:
            problems.append(f"{where}: still open {closed} s after the chunks")
    assert not problems, "\n".join(problems)


def _answer(port: int, path: str, method: str, credential: str, model: str) -> tuple[int, dict[str, object]]:
    """The status and document of an answer, the model's name (which the request gives)
    and what differs between any two answers (request id, instance) taken out;
    ``credential`` is a header line naming the caller."""
    body = json.dumps(
        {"text": "a match", "inputs": [], "model": path.split("/")[2] if "/" in path else ""}
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"{credential}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        data = b""
        while piece := sock.recv(65536):
            data += piece
    head_part, _, payload = data.partition(b"\r\n\r\n")
    status = int(head_part.split(b" ", 2)[1])
    try:
        document = json.loads(payload) if payload else {}
    except ValueError:
        document = {"raw": payload.decode("latin-1")}
    if isinstance(document, dict):
        for varying in ("request_id", "instance"):
            document.pop(varying, None)
    text = json.dumps(document, sort_keys=True).replace(model, "MODEL")
    return status, json.loads(text) if isinstance(document, dict) else {"list": json.loads(text)}


def _credential(kind: str, provider: OidcProvider) -> str:
    """A header line naming a caller limited to text_classifier, of each kind."""
    if kind == "key":
        return f"Authorization: Bearer {LIMITED}"
    if kind == "token":
        return f"Authorization: Bearer {provider.token('texts')}"
    return 'X-Forwarded-Client-Cert: Hash=ab;Subject="CN=lab"'  # kind == "certificate"


@pytest.mark.parametrize("kind", ["key", "token", "certificate"])
def test_a_model_the_caller_may_not_use_answers_as_a_missing_one(
    door: tuple[GatewayProcess, str], provider: OidcProvider, kind: str
) -> None:
    gateway, _ = door
    credential = _credential(kind, provider)
    named = [
        (t, m)
        for t, m in _routes()
        if re.search(r"\{(model|model_name)\}", t) and not t.startswith("/admin/")
    ]
    assert len(named) >= 10, named
    problems = []
    for template, method in named:
        forbidden = _answer(
            gateway.port, _concrete(template, "image_classifier"), method, credential, "image_classifier"
        )
        missing = _answer(
            gateway.port, _concrete(template, "no_such_model"), method, credential, "no_such_model"
        )
        if forbidden != missing:
            problems.append(f"{method} {template}: forbidden {forbidden} but missing {missing}")
        if forbidden[0] >= 500:
            problems.append(f"{method} {template}: {forbidden[0]}")
    assert not problems, "\n".join(problems)
    # and the caller is the one it says: its own model answers
    own = _answer(gateway.port, "/v2/models/text_classifier", "GET", credential, "text_classifier")
    assert own[0] == 200, own


def _methods() -> list[tuple[str, bool]]:
    service = service_pb2.DESCRIPTOR.services_by_name[SERVICE.rsplit(".", 1)[1]]
    methods = [(m.name, m.server_streaming) for m in service.methods]
    assert len(methods) >= 20, methods
    return methods


def _unsent(call: Callable[..., object], metadata: tuple[tuple[str, str], ...], timeout: float) -> str:
    """The status of a call made with ``call`` whose message is never sent."""
    release = threading.Event()

    def nothing() -> Iterator[bytes]:
        release.wait(timeout + 5)
        return
        yield b""

    try:
        result = call(nothing(), metadata=metadata, timeout=timeout)
        if hasattr(result, "__iter__") and not isinstance(result, bytes):
            list(result)
        return "OK"
    except grpc.RpcError as error:
        return str(error.code())
    finally:
        release.set()


@pytest.mark.parametrize("key", [None, "not-a-key"], ids=["no-key", "bad-key"])
def test_every_grpc_method_refuses_an_unknown_caller_before_its_message(
    door: tuple[GatewayProcess, str], key: str | None
) -> None:
    """Each call's message is held back: the refusal must come without it (before, the
    methods other than the inferences had gRPC read a whole message first, up to 44 MiB,
    and waited here for one that never came)."""
    _, address = door
    metadata = () if key is None else (("authorization", f"Bearer {key}"),)
    with grpc.insecure_channel(address) as channel:

        def one(method: tuple[str, bool]) -> str:
            name, streaming = method
            path = f"/{SERVICE}/{name}"
            call = channel.stream_stream(path) if streaming else channel.stream_unary(path)
            return _unsent(call, metadata, timeout=5)

        with ThreadPoolExecutor(8) as pool:
            codes = dict(zip([m for m, _ in _methods()], pool.map(one, _methods()), strict=True))
    assert codes == dict.fromkeys(codes, "StatusCode.UNAUTHENTICATED"), codes


def test_every_health_method_answers_without_its_message(door: tuple[GatewayProcess, str]) -> None:
    """The health service is anyone's (probes carry no key), walked from its descriptor:
    each method answers the door's status with its message never sent, at once (a method
    that read it would have gRPC take it whole, up to the door's largest, from anyone)."""
    _, address = door
    methods = [(m.name, m.server_streaming) for m in health_pb2.DESCRIPTOR.services_by_name["Health"].methods]
    assert {name for name, _ in methods} >= {"Check", "Watch"}, methods
    release = threading.Event()

    def nothing() -> Iterator[bytes]:
        release.wait(30)
        return
        yield b""

    with grpc.insecure_channel(address) as channel:

        def one(method: tuple[str, bool]) -> tuple[bytes, float]:
            name, streaming = method
            path = f"/grpc.health.v1.Health/{name}"
            started = time.monotonic()
            if streaming:
                stream = channel.stream_stream(path)(nothing(), timeout=30)
                first = next(stream)
                stream.cancel()
            else:
                first = channel.stream_unary(path)(nothing(), timeout=30)
            return first, time.monotonic() - started

        try:
            with ThreadPoolExecutor(len(methods)) as pool:
                answered = dict(zip([m for m, _ in methods], pool.map(one, methods), strict=True))
        finally:
            release.set()
    serving = health_pb2.HealthCheckResponse(
        status=health_pb2.HealthCheckResponse.SERVING
    ).SerializeToString()
    assert {first for first, _ in answered.values()} == {serving}, answered
    assert all(seconds < 5 for _, seconds in answered.values()), answered


@pytest.mark.parametrize("kind", ["key", "token", "certificate"])
def test_a_model_the_caller_may_not_use_answers_as_a_missing_one_over_grpc(
    door: tuple[GatewayProcess, str], provider: OidcProvider, kind: str
) -> None:
    _, address = door
    name, _, value = _credential(kind, provider).partition(": ")
    metadata = ((name.lower(), value),)
    requests = {
        "ModelMetadata": service_pb2.ModelMetadataRequest,
        "ModelConfig": service_pb2.ModelConfigRequest,
        "ModelReady": service_pb2.ModelReadyRequest,
        "ModelStatistics": service_pb2.ModelStatisticsRequest,
    }
    with grpc.insecure_channel(address) as channel:

        def ask(method: str, model: str) -> tuple[str, str]:
            call = channel.unary_unary(f"/{SERVICE}/{method}")
            try:
                answer = call(requests[method](name=model).SerializeToString(), metadata=metadata, timeout=10)
            except grpc.RpcError as error:
                return str(error.code()), str(error.details())
            return "OK", answer.hex()

        for method in requests:
            forbidden, missing = ask(method, "image_classifier"), ask(method, "no_such_model")
            forbidden = (forbidden[0], forbidden[1].replace("image_classifier", "MODEL"))
            missing = (missing[0], missing[1].replace("no_such_model", "MODEL"))
            assert forbidden == missing, (method, forbidden, missing)
            assert forbidden[0] not in ("StatusCode.INTERNAL", "StatusCode.UNKNOWN"), (method, forbidden)
        assert ask("ModelReady", "text_classifier")[0] == "OK"  # the key's own model is there


def test_walked_routes_cover_what_the_gateway_serves(tmp_path: Path) -> None:
    """The walk's list is the app's: a route the app gains is walked (the list is read,
    not written here), and the admin surface is in it."""
    templates = {t for t, _ in _routes()}
    for expected in ("/classify", "/v2/models/{model_name}/infer", "/v1/embeddings", "/metrics"):
        assert expected in templates


def test_readyz_names_no_model_to_an_unknown_caller(door: tuple[GatewayProcess, str]) -> None:
    """/readyz stays open to probes, but only a known caller is told what is behind it."""
    gateway, _ = door
    import httpx

    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        anonymous = client.get("/readyz")
        keyed = client.get("/readyz", headers={"authorization": f"Bearer {FULL}"})
    assert anonymous.status_code == keyed.status_code == 200
    assert "classifier" not in anonymous.text, anonymous.text
    assert anonymous.json()["status"] == "ready"
    assert "text_classifier" in keyed.json()["models"]
