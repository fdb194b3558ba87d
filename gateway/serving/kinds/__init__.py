"""The input kinds, by the task a model declares (its ``gateway_task`` parameter).

Adding a kind: a module beside these (a :class:`~gateway.serving.kinds.base.Kind`), its entry
in :data:`KINDS`, and its request fields in :mod:`gateway.http.bodies`.
"""

from __future__ import annotations

from gateway.serving.kinds.base import Caps, Kind
from gateway.serving.kinds.image import ImageKind
from gateway.serving.kinds.text import TextKind
from gateway.serving.payload import ClassifyInput

KINDS: dict[str, Kind] = {kind.task: kind for kind in (ImageKind(), TextKind())}


def kind_of(payload: ClassifyInput) -> Kind:
    """The kind of input a request holds (bodies never mix kinds)."""
    for kind in KINDS.values():
        if kind.count(payload):
            return kind
    raise AssertionError("a ClassifyInput holds inputs of one kind")


__all__ = ["KINDS", "Caps", "Kind", "kind_of"]
