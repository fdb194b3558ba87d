"""Draw one real trace as a waterfall: a real tritonserver with OpenTelemetry and the
gateway with tracing on, both exporting to an OTLP receiver in this process; one
/classify request (two texts) with a known traceparent; its spans drawn with matplotlib.

    .venv/bin/python tests/helpers/trace_waterfall.py --out docs/assets/trace-waterfall.png
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: tests/ holds helpers
from gateway.app import create_app
from gateway.dev.otlpsink import OtlpReceiver, ReceivedSpan
from gateway.dev.tritonserver import TritonServer
from gateway.observe.tracing import triton_trace_args
from gateway.settings import Settings, TracingSettings, TritonSettings

from helpers.support import ServedApp

ROOT = Path(__file__).resolve().parents[2]
COLOURS = {"triton-gateway": "#3b7dd8", "triton-inference-server": "#76b900", "caller": "#999999"}


def ordered(spans: list[ReceivedSpan], root_parent: str) -> list[tuple[int, ReceivedSpan]]:
    """Depth-first, children by start time: (depth, span)."""
    out: list[tuple[int, ReceivedSpan]] = []

    def visit(parent: str, depth: int) -> None:
        for span in sorted((s for s in spans if s.parent_id == parent), key=lambda s: s.start_ns):
            out.append((depth, span))
            visit(span.span_id, depth + 1)

    visit(root_parent, 0)
    return out


def label(span: ReceivedSpan) -> str:
    model = span.attributes.get("triton.model_name")
    if span.service == "triton-inference-server" and model and span.name != model:
        return f"{span.name} ({model})"
    return span.name


def draw(spans: list[ReceivedSpan], caller_span: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rows = ordered(spans, caller_span)
    start = min(s.start_ns for _, s in rows)
    figure, axes = plt.subplots(figsize=(11, 0.32 * len(rows) + 1.2))
    for index, (depth, span) in enumerate(rows):
        left = (span.start_ns - start) / 1e6
        width = max((span.end_ns - span.start_ns) / 1e6, 0.02)
        axes.barh(index, width, left=left, color=COLOURS.get(span.service, "#cc6677"), height=0.7)
        axes.text(left + width + 0.1, index, f"{width:.2f} ms", va="center", fontsize=7, color="#333333")
        axes.text(-0.5, index, "  " * depth + label(span), va="center", ha="right", fontsize=8)
    axes.set_yticks([])
    axes.invert_yaxis()
    axes.set_xlabel("milliseconds since the gateway received the request")
    axes.set_xlim(left=0)
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()][:2]
    axes.legend(handles, ["gateway (triton-gateway)", "Triton (triton-inference-server)"], loc="lower left")
    axes.set_title("One POST /classify (two texts), gateway and Triton spans in one trace", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110, bbox_inches="tight")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / ".reports" / "trace-waterfall.png")
    parser.add_argument("--triton-env", type=Path, default=ROOT / ".venv-triton")
    options = parser.parse_args()
    with OtlpReceiver() as receiver, tempfile.TemporaryDirectory(prefix="trace-") as folder:
        tracing = TracingSettings(
            enabled=True, trust_inbound=True, endpoint=receiver.endpoint, export_delay_seconds=0.2
        )
        triton = TritonServer.on_free_ports(
            options.triton_env,
            ROOT / "model_repository",
            Path(folder),
            response_cache_bytes=0,
            extra_args=tuple(triton_trace_args(tracing)),
        )
        triton.start()
        try:
            triton.wait_ready(timeout=180)
            settings = Settings(
                triton=TritonSettings(url=triton.grpc_url, metrics_url=triton.metrics_url), tracing=tracing
            )
            gateway = ServedApp(create_app(settings), settings).start()
            try:
                texts = ["The striker scored twice in the final.", "Parliament passed the budget."]
                httpx.post(f"{gateway.url}/classify", json={"texts": texts}, timeout=60)  # warm-up
                for _ in range(5):  # Triton now and then loses a trace (README "Tracing")
                    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
                    headers = {"traceparent": f"00-{trace_id}-{caller}-01"}
                    response = httpx.post(f"{gateway.url}/classify", json={"texts": texts}, headers=headers)
                    response.raise_for_status()

                    def all_in(spans: list[ReceivedSpan], trace: str = trace_id) -> bool:
                        return sum(x.trace_id == trace for x in spans) >= 13

                    spans = receiver.wait_for(all_in, timeout=10)
                    mine = [s for s in spans if s.trace_id == trace_id]
                    if any(s.service == "triton-inference-server" for s in mine):
                        break
                time.sleep(1)
                mine = receiver.trace(trace_id)
            finally:
                gateway.stop()
        finally:
            triton.kill()
    options.out.parent.mkdir(parents=True, exist_ok=True)
    draw(mine, caller, options.out)
    print(f"{len(mine)} spans in trace {trace_id}; wrote {options.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
