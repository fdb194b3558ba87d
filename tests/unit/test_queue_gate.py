"""Dispatch gated on Triton's own queue (gateway.serving.queuegate): the window read from
Triton's statistics, each model's limit moved by it, and the admission that holds a
model's requests behind its gate while another model's go."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from gateway.serving.admission import Admission, Tenant
from gateway.serving.queuegate import GateSettings, ModelGate, QueueGate, Totals, totals_of, window_of

MS = 1_000_000  # ns


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def sync() -> None:
        asyncio.run(test())

    return sync


def _document(models: dict[str, Totals]) -> dict[str, Any]:
    """A statistics document as Triton's HTTP JSON writes one (64-bit numbers as strings)."""
    return {
        "model_stats": [
            {
                "name": name,
                "version": "1",
                "execution_count": str(t.executions),
                "inference_stats": {
                    "success": {"count": str(t.count), "ns": "0"},
                    "queue": {"count": str(t.count), "ns": str(t.queue_ns)},
                    "compute_input": {"count": str(t.count), "ns": "0"},
                    "compute_infer": {"count": str(t.count), "ns": str(t.compute_ns)},
                    "compute_output": {"count": str(t.count), "ns": "0"},
                },
            }
            for name, t in models.items()
        ]
    }


def test_totals_are_read_from_triton_json_and_versions_summed() -> None:
    document = _document({"m": Totals(10, 5 * MS, 20 * MS, 4)})
    document["model_stats"].append(dict(document["model_stats"][0], version="2"))
    assert totals_of(document) == {"m": Totals(20, 10 * MS, 40 * MS, 8)}
    assert totals_of({"model_stats": [{"name": "empty"}]}) == {"empty": Totals()}


def test_an_ensembles_wait_is_its_steps_and_its_batch_the_slowest_steps() -> None:
    window = window_of(
        {
            "tokenize": Totals(20, 20 * 2 * MS, 20 * 1 * MS, 5),  # 2 ms queued, 1 ms batch
            "model": Totals(20, 20 * 8 * MS, 20 * 10 * MS, 2),  # 8 ms queued, 10 ms batch
            "idle": Totals(0, 0, 0, 0),
        }
    )
    assert window is not None
    assert window.count == 20
    assert abs(window.queued - 0.010) < 1e-9
    assert abs(window.batch - 0.010) < 1e-9
    assert abs(window.ratio - 1.0) < 1e-9
    assert window_of({"idle": Totals()}) is None


def _steps(count: int, queued_ms: float, batch_ms: float) -> dict[str, Totals]:
    return {"m": Totals(count, int(count * queued_ms * MS), int(count * batch_ms * MS), max(1, count // 8))}


def _add(a: dict[str, Totals], b: dict[str, Totals]) -> dict[str, Totals]:
    return {
        k: Totals(*(x + y for x, y in zip(vars(a[k]).values(), vars(b[k]).values(), strict=True))) for k in a
    }


def test_a_queue_over_the_target_lowers_the_limit_then_holds_it_one_pass() -> None:
    gate = ModelGate(GateSettings(ceiling=64))
    total = _steps(0, 0, 0)
    assert not gate.judge(total, 0.0)  # the first read is the base
    total = _add(total, _steps(40, 40, 10))  # 4 batches queued
    assert gate.judge(total, 0.25)
    assert gate.allowed == 32  # at most halved
    total = _add(total, _steps(40, 40, 10))
    assert not gate.judge(total, 0.26)  # sent under the old limit: held
    total = _add(total, _steps(40, 15, 10))  # 1.5 batches: over the tolerance
    assert gate.judge(total, 1.0)
    assert gate.allowed == 21  # 32 x 1/1.5


def test_a_bound_limit_under_the_target_rises_and_an_unbound_one_does_not() -> None:
    gate = ModelGate(GateSettings(ceiling=64), limit=16)
    total = _steps(0, 0, 0)
    gate.judge(total, 0.0)
    total = _add(total, _steps(40, 2, 10))
    assert not gate.judge(total, 0.25)  # nobody waited for it: no reason to move
    gate.bound = True
    total = _add(total, _steps(40, 2, 10))
    assert gate.judge(total, 0.5)
    assert gate.allowed == 20  # 16 + sqrt(16)


def test_a_window_waits_for_its_samples_and_a_restart_counts_anew() -> None:
    gate = ModelGate(GateSettings(ceiling=64, min_samples=8))
    total = _steps(100, 0, 0)
    gate.judge(total, 0.0)
    assert not gate.judge(_add(total, _steps(4, 100, 10)), 0.25)  # 4 of 8 samples
    assert gate.allowed == 64
    assert gate.judge(_add(total, _steps(8, 100, 10)), 0.5)  # the same window, now 8
    assert gate.allowed == 32
    assert not gate.judge(_steps(5, 100, 10), 5.0)  # counters went back: Triton restarted
    assert gate.allowed == 32


class _Statistics:
    def __init__(self) -> None:
        self.totals: dict[str, Totals] = {}
        self.reads = 0

    async def statistics(self, model: str, version: str) -> dict[str, Any]:
        self.reads += 1
        return _document(self.totals)


def _ensemble(model: str) -> Iterable[str]:
    return {"text": ["tokenize", "model"], "image": ["image"]}[model]


@run
async def test_a_models_requests_wait_behind_its_gate_while_anothers_go() -> None:
    clock = [0.0]
    gate = QueueGate(GateSettings(ceiling=64, min_samples=1), clock=lambda: clock[0])
    admission = Admission(64, queue_seconds=5, retry_after=1, gate=gate, clock=lambda: clock[0])
    source = _Statistics()
    source.totals = {"tokenize": Totals(), "model": Totals(), "image": Totals()}
    held = [await admission.acquire(Tenant("a"), "text") for _ in range(2)]
    await gate.read(source, _ensemble)  # the base
    assert source.reads == 1
    # Triton queued 8 batches of text: its gate falls to half
    source.totals["model"] = Totals(10, 10 * 80 * MS, 10 * 10 * MS, 2)
    source.totals["tokenize"] = Totals(10, 0, 10 * MS, 2)
    admission.by_model["text"] = 40  # as if 40 were in flight
    clock[0] = 0.25
    gate.sent = True
    await gate.read(source, _ensemble)
    assert gate.limit("text") == 32
    waiting = asyncio.create_task(admission.acquire(Tenant("a"), "text"))
    await asyncio.sleep(0)
    assert not waiting.done()  # 40 in flight for a gate of 32
    image = await asyncio.wait_for(admission.acquire(Tenant("a"), "image"), 1)
    assert image.model == "image"  # another model's gate is open
    # the text gate rises once Triton's queue is short and the gate bound
    source.totals["model"] = Totals(30, 10 * 80 * MS, 30 * 10 * MS, 6)
    source.totals["tokenize"] = Totals(30, 0, 30 * MS, 6)
    admission.by_model["text"] = 32
    clock[0] = 5.0
    gate.sent = True
    await gate.read(source, _ensemble)
    assert gate.limit("text") > 32
    ticket = await asyncio.wait_for(waiting, 1)  # granted when the gate rose
    assert ticket.model == "text"
    for t in [*held, image, ticket]:
        admission.release(t)


@run
async def test_an_idle_gateway_asks_triton_nothing() -> None:
    gate = QueueGate(GateSettings())
    source = _Statistics()
    await gate.read(source, _ensemble)
    assert source.reads == 0
    gate.note_sent("image")
    await gate.read(source, _ensemble)
    await gate.read(source, _ensemble)
    assert source.reads == 1
