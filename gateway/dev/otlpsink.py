"""An OTLP/HTTP trace receiver for tests: a real HTTP server on a free local port that
accepts ``POST /v1/traces`` in both encodings the stack uses (the gateway's Python
exporter sends protobuf, Triton's C++ exporter JSON) and keeps every span it is sent."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gateway.dev.tritonserver import free_port


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root span
    name: str
    service: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error


def _value(any_value: dict[str, Any]) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in any_value:
            return any_value[key]
    if "intValue" in any_value:
        return int(any_value["intValue"])
    return None


def _from_json(body: dict[str, Any]) -> list[ReceivedSpan]:
    spans = []
    for resource_spans in body.get("resourceSpans", []):
        resource = {
            a["key"]: _value(a["value"]) for a in resource_spans.get("resource", {}).get("attributes", [])
        }
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                kind = span.get("kind", 0)
                spans.append(
                    ReceivedSpan(
                        trace_id=span["traceId"].lower(),
                        span_id=span["spanId"].lower(),
                        parent_id=span.get("parentSpanId", "").lower(),
                        name=span["name"],
                        service=str(resource.get("service.name", "")),
                        kind=int(kind) if str(kind).isdigit() else 0,
                        start_ns=int(span.get("startTimeUnixNano", 0)),
                        end_ns=int(span.get("endTimeUnixNano", 0)),
                        attributes={a["key"]: _value(a["value"]) for a in span.get("attributes", [])},
                        status_code=int(span.get("status", {}).get("code", 0)),
                    )
                )
    return spans


def _from_protobuf(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attributes: dict[str, Any] = {}
                for attribute in span.attributes:
                    kind = attribute.value.WhichOneof("value")
                    attributes[attribute.key] = getattr(attribute.value, kind) if kind else None
                spans.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        name=span.name,
                        service=resource.get("service.name", ""),
                        kind=int(span.kind),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=attributes,
                        status_code=int(span.status.code),
                    )
                )
    return spans


@dataclass
class OtlpReceiver:
    """``with OtlpReceiver() as receiver:`` then point exporters at ``receiver.endpoint``."""

    port: int = field(default_factory=free_port)
    spans: list[ReceivedSpan] = field(default_factory=list)
    posts: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def __enter__(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as exporters expect of a collector

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if "json" in self.headers.get("Content-Type", ""):
                    spans = _from_json(json.loads(body))
                else:
                    spans = _from_protobuf(body)
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver.posts += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def wait_for(
        self, condition: Callable[[list[ReceivedSpan]], bool], timeout: float = 20.0
    ) -> list[ReceivedSpan]:
        """Every span received once ``condition`` holds on them (or, at the timeout, what came)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if condition(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)
