"""Triton Python model: the configured label set of text_classifier, for discovery."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = Path(args["model_repository"]) / args["model_version"] / params["labels_file"]
        with np.load(path) as stored:
            self.names = np.array([str(n).encode("utf-8") for n in stored["names"]], dtype=np.object_)
            self.prompts = np.array([str(p).encode("utf-8") for p in stored["prompts"]], dtype=np.object_)

    def execute(self, requests: list[Any]) -> list[Any]:
        tensors = [pb_utils.Tensor("LABELS", self.names), pb_utils.Tensor("PROMPTS", self.prompts)]
        return [pb_utils.InferenceResponse(output_tensors=tensors) for _ in requests]
