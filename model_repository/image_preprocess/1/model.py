"""Triton Python model: encoded image bytes -> normalised FP32 [3, H, W] (or [H, W, 3]).

Per image: open with Pillow restricted to the configured formats, decode JPEGs in
draft mode (DCT scaling to about the resize size), apply EXIF orientation, convert to
RGB, resize the short side, centre-crop. Per batch: one vectorised normalisation, in the
network's channel order (``channel_order``: RGB or BGR; ``mean`` and ``std`` are listed
in that order) and layout (``layout``: NCHW or NHWC, which the PIXELS dims follow).

Every classifier of images shares this file (``triton-gateway add-model`` links it into
the models it writes); what differs between them is in their config.pbtxt.

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


def _rotated(image: Image.Image) -> bool:
    """Whether the EXIF orientation asks for a transpose (1, or none, does not)."""
    return image.getexif().get(0x0112, 1) not in (1, None)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        dims = pb_utils.get_output_config_by_name(config, "PIXELS")["dims"]
        self.layout = params.get("layout", "NCHW")
        if self.layout not in ("NCHW", "NHWC"):
            raise pb_utils.TritonModelException(f"layout must be NCHW or NHWC, not {self.layout}")
        self.crop_h, self.crop_w = dims[1:] if self.layout == "NCHW" else dims[:2]
        self.bgr = params.get("channel_order", "RGB") == "BGR"
        self.resize = int(params["resize_short_side"])
        if self.resize < max(self.crop_h, self.crop_w):
            raise pb_utils.TritonModelException("resize_short_side must be >= the crop size")
        self.formats = tuple(params["formats"].split(","))
        self.max_pixels = int(params["max_pixels"])
        self.max_side = int(params["max_side"])
        # Broadcast over [N, H, W, C] uint8 crops.
        self.mean = np.asarray(_floats(params["mean"]), dtype=np.float32)
        self.inv_std = 1.0 / np.asarray(_floats(params["std"]), dtype=np.float32)
        Image.MAX_IMAGE_PIXELS = self.max_pixels

    def _crop(self, data: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(data), formats=self.formats) as opened:
            if opened.width * opened.height > self.max_pixels or max(opened.size) > self.max_side:
                raise InvalidImageError(
                    f"{opened.width}x{opened.height} exceeds {self.max_pixels} pixels or {self.max_side} a side"
                )
            if opened.format == "JPEG":
                # Shrinks by 1/2, 1/4 or 1/8 while decoding, staying >= the resize size.
                opened.draft("RGB", (self.resize, self.resize))
            opened.load()
            image = opened if opened.mode == "RGB" else opened.convert("RGB")
            image = ImageOps.exif_transpose(image, in_place=False) if _rotated(opened) else image
            width, height = image.size
            # Resize the short side to `resize` and centre-crop, as one resample of the
            # crop's source box (no full-size resized copy, no separate crop).
            scale = self.resize / min(width, height)
            box_w, box_h = self.crop_w / scale, self.crop_h / scale
            left, top = (width - box_w) / 2, (height - box_h) / 2
            crop = image.resize(
                (self.crop_w, self.crop_h),
                Image.Resampling.BILINEAR,
                box=(left, top, left + box_w, top + box_h),
            )
        return np.asarray(crop, dtype=np.uint8)

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
            if self.bgr:
                batch = batch[..., ::-1]
            batch -= self.mean
            batch *= self.inv_std
            pixels = np.ascontiguousarray(batch.transpose(0, 3, 1, 2) if self.layout == "NCHW" else batch)
            start = 0
            for index, count in owners:
                tensor = pb_utils.Tensor("PIXELS", pixels[start : start + count])
                responses[index] = pb_utils.InferenceResponse(output_tensors=[tensor])
                start += count
        return responses
