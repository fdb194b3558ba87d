"""Images: header-only checks, a request's images in one batched Triton call, top-k answers.

A model of this kind (``gateway_task: image-classification``) takes ``IMAGE`` (encoded
bytes, BYTES [1]) and ``TOP_K`` (INT32 [1]) and answers ``LABELS``, ``SCORES`` and
``CLASS_IDS``. Read from its configuration (the ensemble or the step that enforces it):
``formats``, ``max_pixels``, ``max_side`` (image_preprocess) and ``max_top_k``
(image_postprocess).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gateway.errors import InvalidImageError, InvalidInputError
from gateway.names import IMAGE_TASK
from gateway.serving.kinds.base import Caps, CapsReader, Kind, classifications, top_k_tensor
from gateway.serving.payload import RAW_IMAGE_TYPES, ClassifyInput
from gateway.serving.validation import ACCEPTED_FORMATS, check_count, inspect_images
from gateway.serving.workers import INLINE_BYTES
from gateway.settings import Settings
from gateway.triton.backend import Classification, InferResult, ModelConfig
from gateway.triton.tensors import Tensor

# What checking one image's header weighs in the workers' unit (bytes of work): up to
# eight images are checked on the event loop, more in a worker thread.
HEADER_CHECK_BYTES = INLINE_BYTES // 8


class ImageKind(Kind):
    task = IMAGE_TASK
    noun = "image"
    accepts = ("multipart/form-data", "application/json", *RAW_IMAGE_TYPES)
    oip_inputs = frozenset({"IMAGE"})

    def caps(self, config: ModelConfig, parameters: Mapping[str, str], settings: Settings) -> Caps:
        read = CapsReader(config.name, parameters)
        image = settings.image
        limits = image.model_copy(
            update={
                "max_pixels": read.narrowed(
                    "max_pixels", read.integer("max_pixels"), image, "max_pixels", "GATEWAY_IMAGE__MAX_PIXELS"
                ),
                "max_side": read.narrowed(
                    "max_side", read.integer("max_side"), image, "max_side", "GATEWAY_IMAGE__MAX_SIDE"
                ),
            }
        )
        declared = {name.strip().upper() for name in parameters.get("formats", "").split(",") if name.strip()}
        formats = [f for f in ACCEPTED_FORMATS if f in declared] if declared else list(ACCEPTED_FORMATS)
        # a request's images go to Triton as batches of at most the ensemble's max_batch_size
        batch = config.max_batch_size or 1
        return read.caps(settings, limits.max_images, limits, {"formats": formats, "batch": batch})

    def count(self, payload: ClassifyInput) -> int:
        return len(payload.images)

    def payload_bytes(self, payload: ClassifyInput) -> int:
        # The checks read headers only (about 40 us for a 220 KiB photo): their work grows
        # with the number of images, not their size; on the event loop a thread hop costs
        # more than the checks (docs/explanation/performance.md).
        return len(payload.images) * HEADER_CHECK_BYTES

    def check(self, payload: ClassifyInput, caps: Caps) -> None:
        check_count(len(payload.images), caps.max_inputs, "images")
        inspect_images(payload.images, caps.limits, tuple(caps.extra["formats"]))

    # A batch that fails as invalid is retried an image at a time, so the error names the
    # image (input_index) and the good ones are answered: the preprocess fails a whole
    # request for one undecodable image (Triton has no per-item errors in one response).
    isolates_failures = True

    def calls(self, payload: ClassifyInput, top_k: int, caps: Caps) -> list[list[Tensor]]:
        # One Triton request for the request's images (in batches of the ensemble's
        # max_batch_size): one gRPC call, one ensemble run, instead of one per image.
        batch = max(1, int(caps.extra.get("batch", 1)))
        images = payload.images
        return [
            [
                Tensor(
                    "IMAGE",
                    "BYTES",
                    np.array([[data] for data in images[start : start + batch]], dtype=np.object_),
                ),
                top_k_tensor(len(images[start : start + batch]), top_k),
            ]
            for start in range(0, len(images), batch)
        ]

    def invalid(self) -> InvalidInputError:
        return InvalidImageError("the model's preprocessing rejected the input (corrupt or truncated data)")

    def results(self, answers: Sequence[InferResult]) -> list[Classification]:
        return [found for answer in answers for found in classifications(answer)]

    def check_tensor(self, tensor: Tensor, caps: Caps) -> Tensor:
        elements = list(tensor.array.reshape(-1))
        check_count(len(elements), caps.max_inputs, "images")
        inspect_images(elements, caps.limits, tuple(caps.extra["formats"]))
        return tensor
