"""Which Triton model version each served classifier is pinned to, changeable at run time.

Starts from the settings (``GATEWAY_IMAGE_MODEL_VERSION``, ``GATEWAY_TEXT_MODEL_VERSION``;
empty: Triton's latest). The admin surface moves a pin (after checking Triton has that
version ready), so a new version takes traffic, and a rollback, without a restart. A pin
lives in this process: a restart returns to the settings, where a lasting change belongs.
"""

from __future__ import annotations

from gateway.settings import ServedModel, Settings


class ServedModels:
    """The served classifiers with their current pins, in the settings' order."""

    def __init__(self, settings: Settings) -> None:
        self._models = {model.name: model for model in settings.served_models()}

    def all(self) -> list[ServedModel]:
        return list(self._models.values())

    def get(self, name: str) -> ServedModel | None:
        return self._models.get(name)

    def version(self, name: str) -> str:
        """The pinned version of a served model ("" for Triton's latest)."""
        return self._models[name].version

    def pin(self, name: str, version: str) -> ServedModel:
        """Move a served model's pin; the caller checked that Triton has it ready."""
        current = self._models[name]
        self._models[name] = ServedModel(current.task, current.name, version)
        return self._models[name]
