"""Images per second per core of `image_preprocess` (its crop function, in-process, CPU
time), against the JPEG decode alone (draft mode), for 2 and 12 Mpx photos; with
``--compare`` an older model.py is measured in the same interleaved rounds (A/B).

    .venv-triton/bin/python tests/benchmarks/bench_preprocess_throughput.py [--compare OLD/model.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = HERE.parents[1] / "model_repository" / "image_preprocess" / "1" / "model.py"
CONFIG = {
    "output": [{"name": "PIXELS", "dims": [3, 224, 224]}],
    "parameters": {
        "formats": {"string_value": "JPEG,PNG,WEBP"},
        "resize_short_side": {"string_value": "256"},
        "mean": {"string_value": "127,127,127"},
        "std": {"string_value": "128,128,128"},
        "max_pixels": {"string_value": "40000000"},
    },
}


def _crop_function(path: Path, name: str) -> Callable[[bytes], Any]:
    """The model's per-image function, from its file, with the pb_utils it needs faked."""
    fake = types.ModuleType("triton_python_backend_utils")
    fake.get_output_config_by_name = lambda config, _: config["output"][0]  # type: ignore[attr-defined]
    fake.TritonModelException = RuntimeError  # type: ignore[attr-defined]
    sys.modules["triton_python_backend_utils"] = fake
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps(CONFIG)})
    return model._crop  # type: ignore[no-any-return]


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
    sys.path.insert(0, str(HERE))
    from bench_preprocess import _image

    candidates: dict[str, Callable[[bytes], Any]] = {"model": _crop_function(MODEL, "current_model")}
    if options.compare:
        candidates["compared"] = _crop_function(options.compare, "compared_model")
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
