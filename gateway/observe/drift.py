"""Drift of each classifier's answers against a reference: the mix of top-1 labels and the
spread of top-1 scores, over a sliding window shared by every replica.

- **Counting** (the request path): one dict increment per classified input, in this
  process (:meth:`DriftMonitor.observe`); no I/O, no lock.
- **Windows**: every ``interval_seconds`` the counts go to the store under the current
  time slot (``slot_seconds`` long, kept for the window and no longer). Redis when the
  replicas share one (``GATEWAY_REDIS__URL``): the window is then every replica's; else
  this process's memory.
- **Reference**: a window frozen by ``POST /admin/models/{model}/reference``, kept in the
  store (Redis, or a file under ``reference_dir``), else the one ``add-model --reference``
  wrote into the model's configuration (``gateway_reference``).
- **Distances**, per model and version, every interval: the Jensen-Shannon distance (base 2,
  0..1) of the live label mix to the reference's, and the Kolmogorov-Smirnov statistic of the
  live top-1 scores against the reference's (on :data:`SCORE_BINS` bins of [0, 1]).
- **What no drift looks like**: the ``quantile`` of each distance between two samples of the
  reference itself, of the reference's size and of the live window's (a bootstrap), exported
  beside it as ``gateway_prediction_drift_threshold``; drift is a distance above it. A fixed
  cut-off (PSI > 0.2) fires most of the time on small undrifted windows; this one does not
  depend on the window's size or the number of classes.

Labels are bounded: a model's first ``max_labels`` distinct labels seen by this process are
counted by name, any later one as :data:`OTHER`; answers over labels the client chose
(zero-shot ``candidate_labels``) are not counted at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gateway.errors import ConflictError, GatewayError
from gateway.observe.metrics import GatewayMetrics
from gateway.periodic import Periodic
from gateway.settings import DriftSettings

logger = logging.getLogger("gateway.drift")

SCORE_BINS = 50
OTHER = "(other)"
# How many bootstrap rounds decide a threshold, and how finely the live window's size is
# bucketed for the cache (thresholds for 1000 and 1040 inputs are the same to a test).
_ROUNDS = 1000
_SIZE_STEP = 1.1
# A reference larger than this is resampled at this size: its own noise is negligible there.
_MAX_REFERENCE_DRAW = 1_000_000


def score_bin(score: float) -> int:
    """The bin of a top-1 score (scores outside [0, 1], or NaN, clip to the ends)."""
    if not score > 0:  # NaN too
        return 0
    return min(int(score * SCORE_BINS), SCORE_BINS - 1)


@dataclass
class Distribution:
    """Counts of top-1 labels and of top-1 scores (by bin)."""

    labels: Counter[str] = field(default_factory=Counter)
    scores: list[int] = field(default_factory=lambda: [0] * SCORE_BINS)

    @property
    def inputs(self) -> int:
        return sum(self.scores)

    @property
    def labelled(self) -> int:
        return sum(self.labels.values())

    def add(self, other: Distribution) -> None:
        self.labels.update(other.labels)
        for index, count in enumerate(other.scores):
            self.scores[index] += count

    def fields(self) -> dict[str, int]:
        """As one flat hash: ``l:<label>`` and ``s:<bin>`` counts (zeros left out)."""
        flat = {f"l:{label}": count for label, count in self.labels.items() if count}
        flat.update({f"s:{index}": count for index, count in enumerate(self.scores) if count})
        return flat

    @classmethod
    def from_fields(cls, flat: Mapping[str, str | int]) -> Distribution:
        found = cls()
        for key, value in flat.items():
            kind, _, name = key.partition(":")
            count = int(value)
            if kind == "l":
                found.labels[name] += count
            elif kind == "s" and name.isdigit() and int(name) < SCORE_BINS:
                found.scores[int(name)] += count
        return found

    def as_json(self) -> dict[str, Any]:
        return {"labels": dict(self.labels.most_common()), "scores": list(self.scores)}

    @classmethod
    def from_json(cls, document: Any) -> Distribution:
        """From :meth:`as_json`'s shape; ValueError when it is not that."""
        if not isinstance(document, dict):
            raise ValueError("a reference is a JSON object with 'labels' and 'scores'")
        labels, scores = document.get("labels"), document.get("scores")
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and type(v) is int and v >= 0 for k, v in labels.items()
        ):
            raise ValueError("'labels' must map each label to a count")
        if (
            not isinstance(scores, list)
            or len(scores) != SCORE_BINS
            or not all(type(v) is int and v >= 0 for v in scores)
        ):
            raise ValueError(f"'scores' must be {SCORE_BINS} counts (top-1 scores in bins of [0, 1])")
        return cls(Counter(labels), list(scores))


@dataclass(frozen=True)
class Reference:
    """What no drift looks like for a model: a distribution and where it came from."""

    distribution: Distribution
    captured_at: float  # unix seconds
    source: str  # "captured" (from live traffic) or "model-config" (add-model --reference)
    version: str = ""  # the version it was captured from ("": every version)

    def as_json(self) -> dict[str, Any]:
        return {
            **self.distribution.as_json(),
            "captured_at": self.captured_at,
            "source": self.source,
            "version": self.version,
        }

    @classmethod
    def from_json(cls, document: Any, source: str | None = None) -> Reference:
        distribution = Distribution.from_json(document)
        if distribution.inputs == 0:
            raise ValueError("a reference holds at least one input")
        captured = document.get("captured_at", 0.0)
        if not isinstance(captured, int | float) or not math.isfinite(captured):
            raise ValueError("'captured_at' must be unix seconds")
        version = document.get("version", "")
        return cls(
            distribution,
            float(captured),
            source or str(document.get("source", "captured")),
            version if isinstance(version, str) else "",
        )

    def summary(self) -> dict[str, Any]:
        return {
            "inputs": self.distribution.inputs,
            "labels": len(self.distribution.labels),
            "captured_at": self.captured_at,
            "source": self.source,
            "version": self.version,
        }


# -- statistics ----------------------------------------------------------------------


def _js(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon distance (base 2) between rows of probability vectors."""
    m = (p + q) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        left = np.where(p > 0, p * np.log2(p / m), 0.0).sum(axis=-1)
        right = np.where(q > 0, q * np.log2(q / m), 0.0).sum(axis=-1)
    distance: np.ndarray = np.sqrt(np.clip((left + right) / 2, 0.0, 1.0))
    return distance


def _ks(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Kolmogorov-Smirnov statistic between rows of binned probability vectors."""
    statistic: np.ndarray = np.abs(np.cumsum(p, axis=-1) - np.cumsum(q, axis=-1)).max(axis=-1)
    return statistic


def _aligned(live: Counter[str], reference: Counter[str]) -> tuple[np.ndarray, np.ndarray]:
    names = sorted(set(live) | set(reference))
    return (
        np.array([live.get(name, 0) for name in names], dtype=float),
        np.array([reference.get(name, 0) for name in names], dtype=float),
    )


def label_distance(live: Counter[str], reference: Counter[str]) -> float:
    a, b = _aligned(live, reference)
    if a.sum() == 0 or b.sum() == 0:
        return 0.0
    return float(_js(a / a.sum(), b / b.sum()))


def score_distance(live: Sequence[int], reference: Sequence[int]) -> float:
    a, b = np.asarray(live, dtype=float), np.asarray(reference, dtype=float)
    if a.sum() == 0 or b.sum() == 0:
        return 0.0
    return float(_ks(a / a.sum(), b / b.sum()))


def _population(counts: np.ndarray) -> np.ndarray:
    """The reference's counts as a distribution, with the classes it never saw put back.

    A reference of a few thousand inputs over 1000 classes misses part of the long tail,
    which live traffic without any drift still reaches. Good-Turing puts the mass unseen at
    the share of classes seen once (f1 / m); Chao1 puts their number at f1^2 / (2 f2). Without
    them the bootstrap below would take the tail for drift."""
    total = float(counts.sum())
    seen: np.ndarray = counts / total
    once, twice = int((counts == 1).sum()), int((counts == 2).sum())
    if once == 0:
        return seen
    unseen = once * once / (2 * twice) if twice else once * (once - 1) / 2
    classes = max(1, min(round(unseen), 100_000))
    missing = min(once / total, 0.5)
    return np.concatenate([seen * (1 - missing), np.full(classes, missing / classes)])


def no_drift(
    counts: np.ndarray,
    live_size: int,
    statistic: Callable[[np.ndarray, np.ndarray], np.ndarray],
    quantile: float,
    rng: np.random.Generator,
) -> float:
    """The ``quantile`` of ``statistic`` between two samples of the population the reference
    was drawn from: one of the reference's size, one of ``live_size``. That is what the
    distance reaches by chance alone, both samples' noise included."""
    p = _population(counts)
    size = min(int(counts.sum()), _MAX_REFERENCE_DRAW)
    live = rng.multinomial(live_size, p, size=_ROUNDS) / live_size
    again = rng.multinomial(size, p, size=_ROUNDS) / size
    return float(np.quantile(statistic(live, again), quantile))


def _digest(distribution: Distribution) -> int:
    """A number from the counts alone (not from when or where they were captured): the same
    reference seeds the same draws, in every replica and every run."""
    document = json.dumps(distribution.as_json(), sort_keys=True).encode()
    return int.from_bytes(hashlib.sha256(document).digest()[:8], "big")


def _step(size: int) -> int:
    return round(math.log(size, _SIZE_STEP)) if size > 0 else 0


def _size(step: int) -> int:
    return max(1, round(_SIZE_STEP**step))


# -- storage -------------------------------------------------------------------------


class DriftStore(Protocol):
    """Where windows and references live: this process, or Redis for every replica."""

    async def add(self, model: str, version: str, slot: int, fields: dict[str, int], ttl: int) -> None: ...

    async def window(self, model: str, version: str, slots: Sequence[int]) -> list[Distribution]:
        """The slots' distributions, newest first (empty ones included)."""
        ...

    async def reference(self, model: str) -> str | None: ...

    async def set_reference(self, model: str, document: str) -> None: ...

    async def delete_reference(self, model: str) -> bool: ...


class LocalDriftStore:
    """One process's windows in memory; references in memory and, with ``directory``, in a
    file per model there (they survive a restart)."""

    def __init__(self, directory: str = "") -> None:
        self._slots: dict[tuple[str, str, int], Distribution] = {}
        self._expiry: dict[tuple[str, str, int], float] = {}
        self._references: dict[str, str] = {}
        self._directory = Path(directory) if directory else None

    async def add(self, model: str, version: str, slot: int, fields: dict[str, int], ttl: int) -> None:
        now = time.monotonic()
        for key in [key for key, until in self._expiry.items() if until < now]:
            del self._slots[key], self._expiry[key]
        key = (model, version, slot)
        self._slots.setdefault(key, Distribution()).add(Distribution.from_fields(fields))
        self._expiry[key] = now + ttl

    async def window(self, model: str, version: str, slots: Sequence[int]) -> list[Distribution]:
        return [self._slots.get((model, version, slot), Distribution()) for slot in slots]

    def _file(self, model: str) -> Path | None:
        return None if self._directory is None else self._directory / f"{model}.json"

    async def reference(self, model: str) -> str | None:
        if model in self._references:
            return self._references[model]
        path = self._file(model)
        if path is None or not path.is_file():
            return None
        self._references[model] = path.read_text(encoding="utf-8")
        return self._references[model]

    async def set_reference(self, model: str, document: str) -> None:
        path = self._file(model)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            staged = path.with_suffix(".json.tmp")
            staged.write_text(document, encoding="utf-8")
            staged.replace(path)  # a reader never sees half a file
        self._references[model] = document

    async def delete_reference(self, model: str) -> bool:
        path = self._file(model)
        found = self._references.pop(model, None) is not None
        if path is not None and path.is_file():
            path.unlink()
            found = True
        return found


class CountStore(Protocol):
    """What :class:`SharedDriftStore` needs of the Redis boundary (gateway.shared.store)."""

    async def add_counts(self, key: str, fields: dict[str, int], ttl: int) -> None: ...

    async def read_counts(self, keys: Sequence[str]) -> list[dict[str, str]]: ...

    async def get_text(self, key: str) -> str | None: ...

    async def set_text(self, key: str, value: str) -> None: ...

    async def delete_key(self, key: str) -> bool: ...


class SharedDriftStore:
    """Windows and references in Redis: one hash per model, version and slot (expiring with
    the window), one string per reference."""

    def __init__(self, counts: CountStore) -> None:
        self._counts = counts

    async def add(self, model: str, version: str, slot: int, fields: dict[str, int], ttl: int) -> None:
        await self._counts.add_counts(f"drift:{model}:{version}:{slot}", fields, ttl)

    async def window(self, model: str, version: str, slots: Sequence[int]) -> list[Distribution]:
        found = await self._counts.read_counts([f"drift:{model}:{version}:{slot}" for slot in slots])
        return [Distribution.from_fields(flat) for flat in found]

    async def reference(self, model: str) -> str | None:
        return await self._counts.get_text(f"reference:{model}")

    async def set_reference(self, model: str, document: str) -> None:
        await self._counts.set_text(f"reference:{model}", document)

    async def delete_reference(self, model: str) -> bool:
        return await self._counts.delete_key(f"reference:{model}")


# -- the monitor ---------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """A classifier as the catalog last read it: its ready versions and the reference its
    configuration carries (``gateway_reference``; empty: none)."""

    model: str
    versions: tuple[str, ...]
    configured: str = ""


@dataclass
class Reading:
    """One model version's last evaluation."""

    inputs: int
    labels: float | None = None
    confidence: float | None = None
    labels_threshold: float | None = None
    confidence_threshold: float | None = None
    top_labels: list[tuple[str, int]] = field(default_factory=list)
    at: float = 0.0

    @property
    def drifting(self) -> bool:
        """Either distance past its threshold."""
        return any(
            value is not None and threshold is not None and value > threshold
            for value, threshold in (
                (self.labels, self.labels_threshold),
                (self.confidence, self.confidence_threshold),
            )
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "inputs": self.inputs,
            "top_labels": dict(self.top_labels),
            "drift": None
            if self.labels is None
            else {
                "labels": self.labels,
                "labels_threshold": self.labels_threshold,
                "confidence": self.confidence,
                "confidence_threshold": self.confidence_threshold,
                "drifting": self.drifting,
            },
            "evaluated_at": self.at,
        }


class DriftMonitor:
    """Counts each model's answers, keeps the shared windows and publishes the distances."""

    def __init__(
        self,
        settings: DriftSettings,
        metrics: GatewayMetrics,
        store: DriftStore,
        served: Callable[[], Iterable[Served]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._metrics = metrics
        self._store = store
        self._served = served
        self._clock = clock
        self._pending: dict[tuple[str, str], Distribution] = {}
        self._known: dict[str, set[str]] = {}
        self._thresholds: dict[tuple[str, str, int, int, int], tuple[float, float]] = {}
        self._readings: dict[tuple[str, str], Reading] = {}
        self._references: dict[str, tuple[str, Reference]] = {}  # model -> (its document, parsed)
        self._published: set[tuple[str, str]] = set()
        self._task: Periodic | None = None

    # -- the request path
    def observe(self, model: str, version: str, label: str | None, score: float) -> None:
        """One classified input's top-1 answer (``label`` None: scores only, e.g. /v2)."""
        tally = self._pending.get((model, version))
        if tally is None:
            tally = self._pending[(model, version)] = Distribution()
        tally.scores[score_bin(score)] += 1
        if label is not None:
            known = self._known.setdefault(model, set())
            if label not in known:
                if len(known) >= self.settings.max_labels:
                    label = OTHER
                else:
                    known.add(label)
            tally.labels[label] += 1

    # -- in the background
    def start(self) -> None:
        self._task = Periodic("drift", self.settings.interval_seconds, self.tick, logger)
        self._task.start()

    async def stop(self) -> None:
        if self._task is not None:
            await self._task.stop()

    def _slot(self, at: float | None = None) -> int:
        return int((self._clock() if at is None else at) // self.settings.slot_seconds)

    def _slots(self) -> list[int]:
        """The window's slots, newest first."""
        newest = self._slot()
        count = max(1, math.ceil(self.settings.window_seconds / self.settings.slot_seconds))
        return list(range(newest, newest - count, -1))

    async def flush(self) -> None:
        """This process's counts into the store, under the current slot; kept for the next
        flush if the store does not take them (bounded: labels are)."""
        pending, self._pending = self._pending, {}
        slot = self._slot()
        ttl = math.ceil(self.settings.window_seconds + 2 * self.settings.slot_seconds)
        for index, ((model, version), tally) in enumerate(pending.items()):
            try:
                await self._store.add(model, version, slot, tally.fields(), ttl)
            except GatewayError:
                for (m, v), rest in list(pending.items())[index:]:
                    self._pending.setdefault((m, v), Distribution()).add(rest)
                raise

    async def window(self, model: str, version: str) -> Distribution:
        """The live window: the slots of the last ``window_seconds``; with ``window_inputs``,
        only the newest slots that reach that many inputs."""
        merged = Distribution()
        for slot in await self._store.window(model, version, self._slots()):
            merged.add(slot)
            if self.settings.window_inputs and merged.inputs >= self.settings.window_inputs:
                break
        return merged

    async def reference(self, model: str, configured: str = "") -> Reference | None:
        """The model's reference: captured (the store's), else its configuration's."""
        document = await self._store.reference(model)
        source = None
        if document is None:
            document, source = configured or None, "model-config"
        if document is None:
            return None
        cached = self._references.get(model)
        if cached is not None and cached[0] == document:
            return cached[1]
        try:
            found = Reference.from_json(json.loads(document), source)
        except ValueError as exc:  # json's errors are ValueErrors too
            logger.error("drift: %s's reference does not parse (%s); none used", model, exc)
            return None
        self._references[model] = (document, found)
        return found

    async def tick(self) -> None:
        # The store's outages are logged by the store (once); the counts wait for the next
        # flush and the gauges keep their last values meanwhile.
        try:
            await self.flush()
            await self.evaluate()
        except GatewayError as exc:
            logger.debug("drift: store unavailable (%s)", exc)

    async def evaluate(self) -> None:
        """Every served model version's window against its model's reference: the gauges,
        and the readings ``/models`` shows."""
        seen: set[tuple[str, str]] = set()
        for served in self._served():
            reference = await self.reference(served.model, served.configured)
            for version in served.versions:
                window = await self.window(served.model, version)
                reading = Reading(inputs=window.inputs, at=self._clock())
                reading.top_labels = window.labels.most_common(5)
                self._readings[(served.model, version)] = reading
                seen.add((served.model, version))
                if reference is not None and window.inputs >= self.settings.min_inputs:
                    tag = _digest(reference.distribution)
                    await self._measure((served.model, version, tag), window, reference, reading)
                self._publish(served.model, version, reading)
        for key in set(self._readings) - seen:
            del self._readings[key]
        for key in self._published - seen:
            self._unpublish(*key)

    async def _measure(
        self, which: tuple[str, str, int], window: Distribution, reference: Reference, reading: Reading
    ) -> None:
        """The distances, and their thresholds (cached per reference and window size)."""
        ref = reference.distribution
        reading.confidence = score_distance(window.scores, ref.scores)
        reading.labels = label_distance(window.labels, ref.labels) if window.labelled else None
        # Window sizes in steps of 10 %, each drawn at its step's own size: the threshold
        # depends on the reference and the step only, so every replica (and every
        # evaluation) draws the same one for the same window.
        inputs, labelled = _step(window.inputs), _step(window.labelled)
        key = (*which, inputs, labelled)
        thresholds = self._thresholds.get(key)
        if thresholds is None:
            quantile = self.settings.quantile
            base = np.array([count for _, count in sorted(ref.labels.items())], dtype=float)
            rng = np.random.default_rng([which[2], inputs, labelled])
            # up to ~0.2 s of numpy for 1000 classes: off the event loop
            labels = (
                await asyncio.to_thread(no_drift, base, _size(labelled), _js, quantile, rng)
                if base.sum() and labelled
                else 1.0
            )
            scores = await asyncio.to_thread(
                no_drift, np.asarray(ref.scores, dtype=float), _size(inputs), _ks, quantile, rng
            )
            thresholds = self._thresholds[key] = (labels, scores)
            if len(self._thresholds) > 4096:  # a cache, not a record: bounded
                self._thresholds.clear()
        reading.labels_threshold, reading.confidence_threshold = thresholds

    def _publish(self, model: str, version: str, reading: Reading) -> None:
        self._metrics.prediction_window.labels(model, version).set(reading.inputs)
        self._published.add((model, version))
        for signal, value, threshold in (
            ("labels", reading.labels, reading.labels_threshold),
            ("confidence", reading.confidence, reading.confidence_threshold),
        ):
            if value is None or threshold is None:
                self._remove(self._metrics.prediction_drift, model, version, signal)
                self._remove(self._metrics.prediction_drift_threshold, model, version, signal)
            else:
                self._metrics.prediction_drift.labels(model, version, signal).set(value)
                self._metrics.prediction_drift_threshold.labels(model, version, signal).set(threshold)

    def _unpublish(self, model: str, version: str) -> None:
        self._published.discard((model, version))
        self._remove(self._metrics.prediction_window, model, version)
        for signal in ("labels", "confidence"):
            self._remove(self._metrics.prediction_drift, model, version, signal)
            self._remove(self._metrics.prediction_drift_threshold, model, version, signal)

    @staticmethod
    def _remove(metric: Any, *values: str) -> None:
        with contextlib.suppress(KeyError):  # never published
            metric.remove(*values)

    # -- the admin surface
    async def capture(self, model: str, versions: Sequence[str]) -> Reference:
        """Freeze the live window of ``versions`` (merged) as the model's reference."""
        await self.flush()
        merged = Distribution()
        for version in versions:
            merged.add(await self.window(model, version))
        if merged.inputs < self.settings.min_inputs:
            raise ConflictError(
                f"the live window of {model} holds {merged.inputs} inputs; a reference needs "
                f"at least {self.settings.min_inputs} (GATEWAY_DRIFT__MIN_INPUTS)"
            )
        reference = Reference(merged, self._clock(), "captured", versions[0] if len(versions) == 1 else "")
        document = json.dumps(reference.as_json(), separators=(",", ":"))
        await self._store.set_reference(model, document)
        self._references[model] = (document, reference)  # shown at once, not at the next read
        self._thresholds.clear()
        return reference

    async def forget(self, model: str) -> bool:
        """Drop the captured reference (the configuration's, if any, applies again)."""
        found = await self._store.delete_reference(model)
        self._references.pop(model, None)
        self._thresholds.clear()
        return found

    def cached_reference(self, model: str) -> Reference | None:
        """The reference the last evaluation read (no store round trip), if any."""
        cached = self._references.get(model)
        return None if cached is None else cached[1]

    def readings(self, model: str) -> dict[str, Reading]:
        return {version: r for (m, version), r in self._readings.items() if m == model}
