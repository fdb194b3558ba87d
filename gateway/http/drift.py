"""A model's drift window and reference as the HTTP answers show them (``GET /models`` and
the admin routes)."""

from __future__ import annotations

from gateway.errors import GatewayError
from gateway.http.schemas import DriftReference, DriftState, DriftVersion
from gateway.observe.drift import DriftMonitor
from gateway.serving.catalog import CatalogEntry


async def drift_state(drift: DriftMonitor, entry: CatalogEntry) -> DriftState | None:
    """The model's reference and live windows (None while the store does not answer)."""
    try:
        # the reference the last evaluation read (every interval); the store only before one
        reference = drift.cached_reference(entry.name) or await drift.reference(entry.name, entry.reference)
    except GatewayError:
        return None
    return DriftState(
        reference=None if reference is None else DriftReference(**reference.summary()),
        versions={
            version: DriftVersion(**reading.as_json())
            for version, reading in sorted(drift.readings(entry.name).items())
        },
    )
