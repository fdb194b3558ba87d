"""What tracing costs a request when it is off: every tracing call the request path
makes (server span, three step spans, the Triton call, trace-id lookups), timed in a loop.

    .venv/bin/python -m gateway.bench.tracing_off

The side-by-side benchmark (``side_by_side --tracing``) measures tracing *on*;
its noise between rounds (10-30 % here) is far above this figure, hence the loop.
"""

from __future__ import annotations

import timeit

from gateway.observe.tracing import Tracing, current_trace, describe_server_span
from gateway.settings import TracingSettings

HEADERS = [(b"host", b"gateway:8080"), (b"content-type", b"application/json"), (b"accept", b"*/*")]


def main() -> int:
    tracing = Tracing(TracingSettings(enabled=False))

    def one_request() -> None:
        with tracing.server_span("POST", "/classify", HEADERS) as span:
            with tracing.span("read body"):
                pass
            with tracing.span("admission"):
                pass
            with tracing.span("validate images"):
                pass
            with tracing.triton_call("image_classifier", "", 2, 250_000):
                pass
            describe_server_span(span, "POST", "/classify", 200)
            current_trace()

    count = 100_000
    best = min(timeit.repeat(one_request, number=count, repeat=5)) / count
    print(f"tracing off: {best * 1e6:.2f} us of CPU per request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
