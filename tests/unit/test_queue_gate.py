"""Dispatch gated on what Triton's statistics say its batches cost (gateway.serving.queuegate):
the batches read from Triton's statistics, the batch worth making from each size's cost
per request, each model's limit, and the admission that holds a model's requests behind its gate while
another model's go."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import pytest

from gateway.errors import TritonUnavailableError
from gateway.serving.admission import Admission, Tenant
from gateway.serving.queuegate import (
    BatchCost,
    Batches,
    GateSettings,
    ModelGate,
    QueueGate,
    Worth,
    batches_of,
    since,
    worth,
)

MS = 1_000_000  # ns


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def sync() -> None:
        asyncio.run(test())

    return sync


def _costs(overhead_ms: float, per_request_ms: float, counts: dict[int, int]) -> Batches:
    """Batches of each size, each costing exactly overhead + per_request x size."""
    return {
        size: BatchCost(count, count * (overhead_ms + per_request_ms * size) * MS)
        for size, count in counts.items()
    }


def _document(models: dict[str, Batches]) -> dict[str, Any]:
    """A statistics document as Triton's HTTP JSON writes one (64-bit numbers as strings;
    compute split in input, inference and output)."""
    return {
        "model_stats": [
            {
                "name": name,
                "version": "1",
                "batch_stats": [
                    {
                        "batch_size": str(size),
                        "compute_input": {"count": str(int(cost.count)), "ns": str(int(cost.ns // 4))},
                        "compute_infer": {"count": str(int(cost.count)), "ns": str(int(cost.ns // 2))},
                        "compute_output": {
                            "count": str(int(cost.count)),
                            "ns": str(int(cost.ns - cost.ns // 4 - cost.ns // 2)),
                        },
                    }
                    for size, cost in batches.items()
                ],
            }
            for name, batches in models.items()
        ]
    }


def test_batches_are_read_from_triton_json_and_versions_summed() -> None:
    document = _document({"m": _costs(5, 10, {1: 4, 8: 2})})
    document["model_stats"].append(dict(document["model_stats"][0], version="2"))
    document["model_stats"].append({"name": "idle"})
    found = batches_of(document)
    assert found["m"] == {1: BatchCost(8, 8 * 15 * MS), 8: BatchCost(4, 4 * 85 * MS)}
    assert found["idle"] == {}


def _measured(per_batch_ms: dict[int, tuple[int, float]]) -> Batches:
    """Batches as measured: each size's count and the milliseconds one of them took."""
    return {size: BatchCost(count, count * ms * MS) for size, (count, ms) in per_batch_ms.items()}


def test_the_batch_worth_making_is_read_from_each_sizes_cost_not_a_line_through_them() -> None:
    # the CPU text model on 2026-11-29, 8 clients and 100: its larger batches are dearer a
    # request (a line through them drifts: 17.5 ms a batch from these, -171 ms from 11-45)
    text = _measured(
        {1: (6, 31), 2: (19, 47), 3: (7, 69), 4: (20, 70), 5: (8, 105), 6: (17, 105), 7: (4, 114)}
    )
    found = worth(text, 0.9)
    assert found is not None
    assert found.size == 4  # 17.5 ms a request, within 10 % of 7's 16.3
    assert found.cheapest == pytest.approx(0.114 / 7)
    assert found.batches == 81
    flood = {**text, 11: BatchCost(1, 271 * MS), 29: BatchCost(2, 2 * 877 * MS), 45: BatchCost(1, 1380 * MS)}
    assert worth(flood, 0.9).size == 4  # type: ignore[union-attr]
    # a size seen once does not set the cheapest: a lucky batch of 8 at 9 ms a request
    assert worth({**text, 8: BatchCost(1, 72 * MS)}, 0.9).size == 4  # type: ignore[union-attr]
    # one size says nothing of batching: it is the batch worth making, and the largest seen
    assert worth(_costs(5, 1, {4: 10}), 0.9) == Worth(4, 9 / 4 / 1000, 10, 4)
    assert worth({}, 0.9) is None
    assert worth(_costs(5, 0, {1: 10, 8: 10}), 0.9).size == 8  # type: ignore[union-attr]  # a GPU's: the largest
    assert worth(_costs(0, 20, {1: 10, 8: 10}), 0.9).size == 1  # type: ignore[union-attr]  # batching gains nothing


def test_since_is_what_ran_between_reads_and_a_restart_counts_anew() -> None:
    before = _costs(1, 1, {1: 10, 2: 5})
    now = _costs(1, 1, {1: 12, 2: 5, 4: 1})
    assert since(now, before) == {1: BatchCost(2, 2 * 2 * MS), 4: BatchCost(1, 5 * MS)}
    assert since(_costs(1, 1, {1: 3}), before) == _costs(1, 1, {1: 3})


def _read(gate: ModelGate, totals: dict[str, Batches], elapsed: float = 0.25) -> bool:
    return gate.judge(totals, elapsed)


def test_the_limit_is_a_batch_worth_making_running_and_one_waiting() -> None:
    gate = ModelGate(GateSettings(ceiling=64))
    steps = {"tokenize": _costs(1.3, 0.2, {}), "model": _costs(6.6, 18.9, {}), "post": _costs(3.6, 0.2, {})}
    assert not _read(gate, steps)  # the first read is the base
    assert gate.limit == 64
    steps = {
        "tokenize": _costs(1.3, 0.2, {1: 100, 2: 50, 16: 2}),
        "model": _costs(6.6, 18.9, {1: 80, 2: 50, 4: 6, 33: 2}),
        "post": _costs(3.6, 0.2, {1: 80, 2: 50, 33: 2}),
    }
    assert _read(gate, steps)
    # the model step is the bottleneck: its batches of 33 the cheapest a request (19.1 ms),
    # 4 the smallest within 10 % (20.55 ms); 2 x 4 running and waiting, and one in each
    # other step
    assert gate.limit == 8 + 2
    assert gate.last is not None
    assert gate.last.size == 4


def test_slower_by_the_same_factor_everywhere_leaves_the_limit() -> None:
    fast, slow = ModelGate(GateSettings()), ModelGate(GateSettings())
    for gate, factor in ((fast, 1), (slow, 5)):
        _read(gate, {"m": {}})
        _read(gate, {"m": _costs(6.6 * factor, 18.9 * factor, {1: 40, 3: 20, 8: 5})})
    assert fast.limit == slow.limit == 6  # batches of 3 (21.1 ms a request; of 8, 19.7)


def test_batching_for_free_opens_to_the_ceiling_and_a_first_fit_without_overhead_is_cautious() -> None:
    gpu = ModelGate(GateSettings(ceiling=64), limit=4)
    _read(gpu, {"m": {}})
    assert _read(gpu, {"m": _costs(5, 0, {1: 10, 32: 10})})
    assert gpu.limit == 64
    # a batch's time proportional to its size as the first fit: batching gains nothing
    # measurable, the cautious limit (one running, one waiting)
    linear = ModelGate(GateSettings(ceiling=64), limit=9)
    _read(linear, {"m": {}})
    assert _read(linear, {"m": _costs(0, 20, {1: 10, 8: 10})})
    assert linear.limit == 2


def test_a_light_load_of_one_batch_size_leaves_room_for_twice_it_not_the_ceiling() -> None:
    """A light load of 2 clients whose batches were all of 2 (55 of them, 11 ms a
    request): the flood after it starts from room for batches of 4 running and waiting,
    and one request in the other step, not from the ceiling (where its first wave read a
    p99 2.7x the steady one's)."""
    gate = ModelGate(GateSettings(ceiling=64))
    _read(gate, {"model": {}, "post": {}})
    assert _read(gate, {"model": _costs(2, 10, {2: 55}), "post": _costs(1, 1, {2: 55})})
    assert gate.limit == 2 * 4 + 1


def test_until_enough_batches_are_seen_the_limit_stays() -> None:
    gate = ModelGate(GateSettings(ceiling=64, min_batches=8))
    _read(gate, {"m": {}})
    assert not _read(gate, {"m": _costs(6.6, 18.9, {1: 3, 4: 2})})  # 5 batches
    assert gate.limit == 64
    assert _read(gate, {"m": _costs(6.6, 18.9, {1: 6, 4: 4})})  # 10 now
    assert gate.limit < 64


def test_what_was_measured_is_forgotten_as_the_model_changes() -> None:
    gate = ModelGate(GateSettings(ceiling=64, memory_seconds=1.0))
    _read(gate, {"m": {}})
    totals = _costs(5, 0, {1: 50, 3: 50, 8: 50})  # a GPU-like model: a fixed cost per batch
    _read(gate, {"m": totals})
    # the largest batches seen, 8, the cheapest a request: room for twice them, 2 x 16
    assert gate.limit == 32
    for second in range(1, 11):  # then a CPU-like one: 6.6 ms + 18.9 ms a request
        now = _costs(6.6, 18.9, {1: 50 * second, 3: 50 * second, 8: 50 * second})
        _read(
            gate,
            {
                "m": {
                    size: BatchCost(totals[size].count + c.count, totals[size].ns + c.ns)
                    for size, c in now.items()
                }
            },
            1.0,
        )
    assert gate.limit == 6  # batches of 3: 21.1 ms a request, within 10 % of 8's 19.7


class _Statistics:
    def __init__(self) -> None:
        self.models: dict[str, Batches] = {}
        self.reads = 0

    async def statistics(self, model: str, version: str) -> dict[str, Any]:
        self.reads += 1
        return _document(self.models)


def _steps(model: str) -> Iterable[str]:
    return {"text": ["tokenize", "model"], "image": ["image"]}[model]


@run
async def test_a_models_requests_wait_behind_its_gate_while_anothers_go() -> None:
    gate = QueueGate(GateSettings(ceiling=64))
    admission = Admission(64, queue_seconds=5, retry_after=1, gate=gate)
    source = _Statistics()
    source.models = {"tokenize": {}, "model": {}, "image": {}}
    held = [await admission.acquire(Tenant("a"), "text") for _ in range(8)]
    await gate.read(source, _steps)  # the base
    # batches of 4: a limit of 9 (a batch of 8 seen dearer: no room made for larger ones)
    source.models["model"] = _costs(10, 10, {1: 20, 4: 20}) | {8: BatchCost(20, 20 * 8 * 15 * MS)}
    source.models["tokenize"] = _costs(1, 0.1, {1: 20, 4: 20})
    gate.sent = True
    await gate.read(source, _steps)
    assert gate.limit("text") == 9
    # what the gauges show: each model's gate, its batch worth making and cheapest cost
    readings = {r.model: r for r in admission.reading().gates}
    assert (readings["text"].limit, readings["text"].batch) == (9, 4)
    assert readings["text"].cost_seconds == pytest.approx(0.0125)  # (10 + 4 x 10) / 4 ms
    assert set(readings) == {"text"}  # a model nothing was sent to has no gate yet
    held += [await admission.acquire(Tenant("a"), "text")]
    waiting = asyncio.create_task(admission.acquire(Tenant("a"), "text"))
    await asyncio.sleep(0)
    assert not waiting.done()  # 9 in flight for a gate of 9
    image = await asyncio.wait_for(admission.acquire(Tenant("a"), "image"), 1)
    assert image.model == "image"  # another model's gate is open
    assert admission.limit == 64  # the models' limits together, within the ceiling
    # the batches of text grow cheaper: its gate rises and its waiter goes
    source.models["model"] = _costs(10, 10, {1: 20, 4: 20, 16: 1000}) | {8: BatchCost(20, 20 * 8 * 15 * MS)}
    source.models["model"] = {
        s: BatchCost(c.count, c.ns if s < 16 else c.count * 12 * MS)
        for s, c in source.models["model"].items()
    }
    gate.sent = True
    await gate.read(source, _steps)
    assert gate.limit("text") > 9
    ticket = await asyncio.wait_for(waiting, 1)
    assert ticket.model == "text"
    for t in [*held, image, ticket]:
        admission.release(t)
    assert admission.by_model == {}


@run
async def test_an_idle_gateway_asks_triton_nothing() -> None:
    gate = QueueGate(GateSettings())
    source = _Statistics()
    await gate.read(source, _steps)
    assert source.reads == 0
    gate.note_sent("image")
    await gate.read(source, _steps)
    await gate.read(source, _steps)
    assert source.reads == 1


class _Down:
    async def statistics(self, model: str, version: str) -> dict[str, Any]:
        raise TritonUnavailableError("down")


@run
async def test_a_triton_that_does_not_answer_leaves_the_gates_as_they_are() -> None:
    gate = QueueGate(GateSettings(ceiling=32))
    gate.note_sent("image")
    await gate.read(_Down(), _steps)  # no error: the breaker and the probe report Triton
    assert gate.limit("image") == 32


def test_batches_whose_cost_is_all_proportional_to_their_size_give_the_cautious_limit() -> None:
    # a light load's batches of 1 and 2, their time proportional to their size: batching
    # gains nothing measurable, one running and one waiting, and one in the other step
    gate = ModelGate(GateSettings(ceiling=64))
    _read(gate, {"model": {}, "post": {}})
    assert _read(gate, {"model": _costs(0, 20, {1: 10, 2: 10}), "post": _costs(1, 1, {1: 20})})
    assert gate.limit == 2 + 1
    # and the flood's larger batches, once seen cheaper a request, open it
    assert _read(
        gate,
        {"model": _costs(0, 20, {1: 10, 2: 10}) | _costs(40, 10, {6: 10}), "post": _costs(1, 1, {1: 20})},
    )
    # (6 the largest seen and the cheapest: room for twice it, 2 x 12)
    assert gate.limit == 24 + 1


def test_while_the_largest_batch_seen_is_the_cheapest_the_limit_makes_room_for_twice_it() -> None:
    """A limit that never had room to form a larger batch would never learn whether one
    pays: while the batch worth making is the largest seen, the limit makes room for
    twice it; once a larger batch is seen and is no cheaper, back to the one worth making."""
    gate = ModelGate(GateSettings(ceiling=64))
    _read(gate, {"m": {}})
    light = _costs(10, 20, {1: 10, 2: 10})  # a light load's: 2 is the cheapest (25 ms a request)
    assert _read(gate, {"m": light})
    assert gate.last is not None
    assert (gate.last.size, gate.last.largest, gate.limit) == (2, 2, 2 * 4)  # room for 4
    # batches of 4 formed, and of 7 at 21 ms a request, no cheaper than 4 (22.5 ms) by 10 %
    flood = light | _costs(10, 20, {4: 10}) | {7: BatchCost(10, 10 * 7 * 21 * MS)}
    _read(gate, {"m": flood})
    assert (gate.last.size, gate.last.largest, gate.limit) == (4, 7, 2 * 4)
    # without the room it made, the light load's batches alone would have held it at 2 x 2


def test_replicas_are_read_together_each_on_its_own_counters_and_the_limit_is_one_replicas_times_theirs() -> (
    None
):
    """Several Tritons behind one gateway (gateway.serving.placement): each replica's
    statistics are its own counters, so what ran is taken per replica; their batches are
    read together, and the gate allows one replica's limit on each. A replica that
    restarts (its counters back to zero) or leaves takes nothing from another's."""
    gate = ModelGate(GateSettings(ceiling=64))
    assert not gate.judge_replicas({"a": {"m": {}}, "b": {"m": {}}}, 0.25)  # the bases
    # a's history is large, b's small: only what ran since the base counts
    a = _costs(10, 10, {1: 20, 4: 20})
    b = _costs(10, 10, {1: 20, 4: 20})
    assert gate.judge_replicas({"a": {"m": a}, "b": {"m": b}}, 0.25)
    one = ModelGate(GateSettings(ceiling=64))
    one.judge({"m": {}}, 0.25)
    one.judge({"m": a}, 0.25)
    # batches of 4, the largest seen: room for 8, 2 of them (target 1), one step
    assert one.limit == 16
    assert gate.limit == 2 * 16
    # b restarts (counters from zero) and then leaves: the limit follows the replicas read
    gate.judge_replicas(
        {"a": {"m": _costs(10, 10, {1: 40, 4: 40})}, "b": {"m": _costs(10, 10, {1: 2})}}, 0.25
    )
    assert gate.limit == 2 * 16
    assert gate.judge_replicas({"a": {"m": _costs(10, 10, {1: 60, 4: 60})}}, 0.25)
    assert gate.limit == 16
    # the ceiling bounds the replicas together
    many = ModelGate(GateSettings(ceiling=64))
    bases: dict[str, dict[str, Batches]] = {str(i): {"m": {}} for i in range(9)}
    many.judge_replicas(bases, 0.25)
    many.judge_replicas({str(i): {"m": a} for i in range(9)}, 0.25)
    assert many.limit == 64


@run
async def test_the_gate_reads_every_replicas_statistics_when_given_them() -> None:
    gate = QueueGate(GateSettings(ceiling=64))
    replicas = {"a": _Statistics(), "b": _Statistics()}
    for source in replicas.values():
        source.models = {"tokenize": {}, "model": {}}

    async def each() -> dict[str, dict[str, Any]]:
        return {address: await source.statistics("", "") for address, source in replicas.items()}

    gate.note_sent("text")
    await gate.read(each, _steps)  # the bases
    for source in replicas.values():
        source.models["model"] = _costs(10, 10, {1: 20, 4: 20})
        source.models["tokenize"] = _costs(1, 0.1, {1: 20, 4: 20})
    gate.sent = True
    await gate.read(each, _steps)
    assert gate.limit("text") == 2 * 17  # batches of 4 the largest seen: room for 8, 2 x 8 + 1
