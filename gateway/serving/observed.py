"""What the models answered, observed on every door: the prediction metrics (confidence,
the floor, sigmoid labels over the threshold) and the drift windows, for the answers of
``/classify`` (before any threshold) and a classifier's SCORES on ``/v2`` and the gRPC
door. Answers over labels the client chose (zero-shot ``candidate_labels``) feed the
metrics, never the drift windows: they are not the model's own classes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.observe.drift import DriftMonitor
from gateway.observe.metrics import GatewayMetrics
from gateway.serving.catalog import CatalogEntry
from gateway.settings import PredictionSettings
from gateway.triton.backend import Classification
from gateway.triton.tensors import Tensor


class PredictionObserver:
    """Built once by the runtime; the dispatcher tells it every answer."""

    def __init__(
        self, metrics: GatewayMetrics, predictions: PredictionSettings, drift: DriftMonitor | None = None
    ) -> None:
        self.metrics = metrics
        self.predictions = predictions
        self.drift = drift

    def _observe(
        self, entry: CatalogEntry, version: str, rows: Iterable[Sequence[float]], threshold: float | None
    ) -> None:
        self.metrics.predictions(
            entry.name,
            version,
            rows,
            self.predictions.floor(entry.name),
            entry.caps.extra.get("activation") == "sigmoid",
            0.5 if threshold is None else threshold,
        )

    def classified(
        self, entry: CatalogEntry, answers: list[Classification], threshold: float | None, own_labels: bool
    ) -> None:
        """The answers (before any threshold) in the prediction metrics and the drift
        windows (not answers over labels the client chose: ``own_labels``)."""
        if not answers:
            return
        version = answers[0].model_version
        rows = ([p.score for p in answer.predictions] for answer in answers)
        self._observe(entry, version, rows, threshold)
        if self.drift is not None and not own_labels:
            for answer in answers:
                if answer.predictions:
                    best = answer.predictions[0]
                    self.drift.observe(entry.name, version, best.label, best.score)

    def scored(self, entry: CatalogEntry, version: str, scores: Tensor, own_labels: bool) -> None:
        """A classifier's SCORES on the Open Inference Protocol (best first, one row an
        input), recorded as on /classify; the labels are the client's to ask for there."""
        if scores.array.ndim != 2 or scores.datatype == "BYTES":
            return  # (the classification extension's strings, when the client asked for them)
        rows = scores.array.tolist()
        self._observe(entry, version, rows, None)
        if self.drift is not None and not own_labels:
            for row in rows:
                if row:
                    self.drift.observe(entry.name, version, None, row[0])
