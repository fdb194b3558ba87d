"""The cost ledger's rules (gateway/bench/ledger.py): a sample goes to the stage of its
innermost frame that names one."""

from __future__ import annotations

from gateway.bench.ledger import shares, stage_of

ROOT = "<module> (gateway/__main__.py:312);run_server (gateway/http/server.py:201)"
TELEMETRY = f"{ROOT};TelemetryMiddleware.__call__ (gateway/http/telemetry.py:85)"


def test_the_innermost_named_frame_decides() -> None:
    logged = f"{TELEMETRY};TelemetryMiddleware._record (gateway/http/telemetry.py:106);Logger.info (logging/__init__.py:1489)"
    assert stage_of(logged) == "access log"
    assert stage_of(f"{TELEMETRY};add_response_headers (gateway/http/requestid.py:51)") == (
        "telemetry middleware (request id, headers)"
    )
    call = f"{TELEMETRY};TritonBackend.infer (gateway/triton/client.py:255);UnaryUnaryCall._invoke (grpc/aio/_call.py:595)"
    assert stage_of(call) == "gRPC call machinery (grpc.aio)"
    assert (
        stage_of(f"{TELEMETRY};from_raw (gateway/triton/tensors.py:122)")
        == "Triton request building and reading"
    )
    # the gateway's uvicorn protocol writing an answer is the HTTP server, as uvicorn's own
    # write is the reference's (it was counted as the routes: 8 % of a text request)
    flushed = f"{ROOT};_LingerOnClose.flush (gateway/http/protocol.py:64)"
    assert stage_of(flushed) == "HTTP server (uvicorn, httptools)"
    assert (
        stage_of(f"{TELEMETRY};FastLane.__call__ (gateway/http/fastlane.py:162)")
        == "routes and the fast lane"
    )
    assert stage_of("Thread.run (threading.py:982)") == "event loop, sockets, threads"
    assert stage_of("something (elsewhere.py:1)") == "other"


def test_shares_add_up() -> None:
    raw = f"{TELEMETRY};Logger.info (logging/__init__.py:1) 3\n{TELEMETRY};from_raw (gateway/triton/tensors.py:1) 1\n"
    assert shares(raw) == {"access log": 0.75, "Triton request building and reading": 0.25}
