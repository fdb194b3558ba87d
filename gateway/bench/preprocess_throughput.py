"""Images per second per core of `image_preprocess` (its crop function, in-process, CPU
time), against the JPEG decode alone (draft mode), for 2 and 12 Mpx photos; with
``--compare`` an older model.py is measured in the same interleaved rounds (A/B).

    .venv-triton/bin/python -m gateway.bench.preprocess_throughput [--compare OLD/model.py]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = HERE.parents[1] / "model_repository" / "image_preprocess" / "1" / "model.py"


def _decode_only(data: bytes) -> None:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.draft("RGB", (256, 256))
        image.load()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", type=Path, help="an older image_preprocess model.py (A/B)")
    parser.add_argument("--megapixels", type=float, nargs="+", default=[2, 12])
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args(argv)
    from gateway.bench.preprocess import _image, load_model

    candidates: dict[str, Callable[[bytes], Any]] = {"model": load_model(MODEL, "current_model")._crop}
    if options.compare:
        candidates["compared"] = load_model(options.compare, "compared_model")._crop
    candidates["decode alone"] = _decode_only
    report = []
    for megapixels in options.megapixels:
        data = _image("JPEG", megapixels)
        repeat = max(3, int(60 / megapixels))
        times: dict[str, list[float]] = {name: [] for name in candidates}
        for _ in range(options.rounds):
            for name, function in candidates.items():
                started = time.process_time()
                for _ in range(repeat):
                    function(data)
                times[name].append((time.process_time() - started) / repeat)
        row: dict[str, Any] = {"megapixels": megapixels}
        for name, samples in times.items():
            seconds = float(np.median(samples))
            row[name] = {"ms": round(seconds * 1000, 2), "images_per_s_per_core": round(1 / seconds)}
        report.append(row)
        line = ", ".join(f"{n} {row[n]['ms']} ms ({row[n]['images_per_s_per_core']}/s)" for n in times)
        print(f"{megapixels:g} Mpx JPEG: {line}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
