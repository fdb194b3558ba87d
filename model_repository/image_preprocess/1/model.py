"""Triton Python model: encoded image bytes -> normalised FP32 [3, H, W].

Per image: open with Pillow restricted to the configured formats, decode JPEGs in
draft mode (DCT scaling to about the resize size), apply EXIF orientation, convert to
RGB, resize the short side, centre-crop. Per batch: one vectorised normalisation.

Any failure on one image (Pillow raises many kinds for hostile files: OSError,
ValueError, SyntaxError, struct.error, TypeError, KeyError from malformed EXIF, ...)
fails only its own request, with INVALID_ARG, so Triton reports it as a client error and
the other requests in the batch succeed.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image, ImageOps


class InvalidImageError(Exception):
    """The bytes are not an image this model accepts."""


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",")]


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        _, self.crop_h, self.crop_w = pb_utils.get_output_config_by_name(config, "PIXELS")["dims"]
        self.resize = int(params["resize_short_side"])
        if self.resize < max(self.crop_h, self.crop_w):
            raise pb_utils.TritonModelException("resize_short_side must be >= the crop size")
        self.formats = tuple(params["formats"].split(","))
        self.max_pixels = int(params["max_pixels"])
        # Broadcast over [N, H, W, C] uint8 crops.
        self.mean = np.asarray(_floats(params["mean"]), dtype=np.float32)
        self.inv_std = 1.0 / np.asarray(_floats(params["std"]), dtype=np.float32)
        Image.MAX_IMAGE_PIXELS = self.max_pixels

    def _crop(self, data: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(data), formats=self.formats) as image:
            if image.width * image.height > self.max_pixels:
                raise InvalidImageError(f"{image.width}x{image.height} exceeds {self.max_pixels} pixels")
            if image.format == "JPEG":
                # Shrinks by 1/2, 1/4 or 1/8 while decoding, staying >= the resize size.
                image.draft("RGB", (self.resize, self.resize))
            image = ImageOps.exif_transpose(image).convert("RGB")
        width, height = image.size
        scale = self.resize / min(width, height)
        size = (max(self.crop_w, round(width * scale)), max(self.crop_h, round(height * scale)))
        image = image.resize(size, Image.Resampling.BILINEAR)
        left = (size[0] - self.crop_w) // 2
        top = (size[1] - self.crop_h) // 2
        image = image.crop((left, top, left + self.crop_w, top + self.crop_h))
        return np.asarray(image, dtype=np.uint8)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        crops: list[np.ndarray] = []
        owners: list[tuple[int, int]] = []  # (request index, images in it) for the split
        for index, request in enumerate(requests):
            blobs = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy().reshape(-1)
            try:
                mine = []
                for position, blob in enumerate(blobs):
                    try:
                        mine.append(self._crop(bytes(blob)))
                    except Exception as exc:  # any failure is this input's, never the batch's
                        name = type(exc).__name__
                        raise InvalidImageError(f"image {position} cannot be decoded ({name})") from exc
            except InvalidImageError as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses[index] = pb_utils.InferenceResponse(output_tensors=[], error=error)
                continue
            crops.extend(mine)
            owners.append((index, len(mine)))

        if crops:
            batch = np.stack(crops).astype(np.float32)
            batch -= self.mean
            batch *= self.inv_std
            pixels = np.ascontiguousarray(batch.transpose(0, 3, 1, 2))
            start = 0
            for index, count in owners:
                tensor = pb_utils.Tensor("PIXELS", pixels[start : start + count])
                responses[index] = pb_utils.InferenceResponse(output_tensors=[tensor])
                start += count
        return responses
