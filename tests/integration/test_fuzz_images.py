"""Fuzzing the real stack with mutated real images, while another client sends good ones.

Hypothesis mutates real JPEG/PNG/WebP files (EXIF, XMP, ICC and text segments most of all,
see tests/helpers/imagefuzz.py); each mutated file goes to the real gateway and the real Triton
ensemble, concurrently with a client sending good photos, so Triton's dynamic batcher puts
hostile and good images in the same batch. The budget is fixed (examples and seconds).
"""

from __future__ import annotations

import io
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from helpers.imagefuzz import mutated_images, seeds
from helpers.support import ServedApp, chelsea_jpeg, coffee_png

CLIENT_ERRORS = {400, 413, 415, 422}
FUZZ_EXAMPLES = 300
FUZZ_SECONDS = 75.0
FILES_PER_EXAMPLE = 4


def exif_type_confusion() -> bytes:
    """The JPEG seed with its EXIF 'Make' entry retyped from ASCII to RATIONAL at offset 0:
    valid headers, and Pillow's EXIF rewrite raises AttributeError (not a decode error)."""
    seed = next(s for s in seeds() if s.name == "jpeg-exif-icc-xmp").data
    exif = Image.open(io.BytesIO(seed)).getexif()
    assert exif[0x010F] == "triton-gateway"
    start = seed.index(b"Exif\x00\x00") + 6
    order: Literal["little", "big"] = "little" if seed[start : start + 2] == b"II" else "big"
    make = seed.index((0x010F).to_bytes(2, order) + (2).to_bytes(2, order), start)
    data = bytearray(seed)
    data[make + 2 : make + 4] = (5).to_bytes(2, order)
    data[make + 8 : make + 12] = bytes(4)
    return bytes(data)


class GoodClient:
    """Sends good photos in a loop from its own connection; records every status."""

    def __init__(self, url: str) -> None:
        self.statuses: Counter[int] = Counter()
        self.wrong: list[str] = []
        self._url = url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self._url, timeout=60) as client:
            while not self._stop.is_set():
                files = [("file", ("a.jpg", chelsea_jpeg())), ("file", ("b.png", coffee_png()))]
                response = client.post("/classify", files=files)
                self.statuses[response.status_code] += 1
                if response.status_code == 200:
                    labels = [r["predictions"][0]["label"] for r in response.json()["results"]]
                    if labels[1] != "espresso" or "cat" not in labels[0]:
                        self.wrong.append(str(labels))

    def __enter__(self) -> GoodClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


@pytest.fixture
def good_client(gateway: ServedApp) -> Iterator[GoodClient]:
    with GoodClient(gateway.url) as client:
        yield client


def test_exif_type_confusion_fails_only_its_own_input(http: httpx.Client, good_client: GoodClient) -> None:
    bad = exif_type_confusion()
    for _ in range(5):
        files = [
            ("file", ("a.jpg", chelsea_jpeg())),
            ("file", ("b.png", coffee_png())),
            ("file", ("c.jpg", bad)),
        ]
        response = http.post("/classify", files=files)
        assert response.status_code == 422, response.text
        problem = response.json()
        assert problem["type"].endswith(":invalid-image")
        assert problem["input_index"] == 2
    time.sleep(0.5)
    assert good_client.statuses[200] > 0
    assert set(good_client.statuses) == {200}, good_client.statuses


def test_fuzzed_images_never_5xx_and_never_harm_good_ones(
    gateway: ServedApp, good_client: GoodClient
) -> None:
    statuses: Counter[int] = Counter()
    deadline = time.monotonic() + FUZZ_SECONDS
    pool = ThreadPoolExecutor(FILES_PER_EXAMPLE)
    client = httpx.Client(base_url=gateway.url, timeout=60, limits=httpx.Limits(max_connections=8))

    def send(data: bytes) -> int:
        response = client.post(
            "/classify", content=data, headers={"content-type": "application/octet-stream"}
        )
        if response.status_code >= 500:
            pytest.fail(f"{response.status_code} for a {len(data)}-byte image: {response.text}")
        return response.status_code

    @settings(
        max_examples=FUZZ_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(st.lists(mutated_images(), min_size=FILES_PER_EXAMPLE, max_size=FILES_PER_EXAMPLE))
    def fuzz(files: list[bytes]) -> None:
        if time.monotonic() > deadline:
            return  # the time budget is spent; the remaining examples pass at once
        for status in pool.map(send, files):
            statuses[status] += 1
            assert status == 200 or status in CLIENT_ERRORS, status

    try:
        fuzz()
    finally:
        pool.shutdown()
        client.close()
    sent = sum(statuses.values())
    print(f"fuzzed {sent} files: {dict(sorted(statuses.items()))}; good client: {dict(good_client.statuses)}")
    assert sent >= 400, "the fuzzer barely ran"
    # It reached Triton's decoder both ways.
    assert statuses[422] > 0, statuses
    assert statuses[200] > 0, statuses
    assert set(good_client.statuses) == {200}, good_client.statuses
    assert not good_client.wrong
