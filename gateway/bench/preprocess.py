"""What one image costs `image_preprocess` (the real model code, outside Triton): decode
time and peak memory by format and pixel count, each case in a fresh process so its peak
RSS is its own. The figures behind the pixel caps and the instance count (README,
"Reliability and security").

    .venv-triton/bin/python -m gateway.bench.preprocess [--megapixels 1 12 24 40]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "model_repository" / "image_preprocess"


def _image(fmt: str, megapixels: float) -> bytes:
    """A photo-like image (smooth gradients plus noise, so it compresses like a photo)."""
    from PIL import Image

    width = int((megapixels * 1e6 * 4 / 3) ** 0.5)
    height = int(megapixels * 1e6 / width)
    x = np.linspace(0, 255, width, dtype=np.float32)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    noise = np.random.default_rng(0).integers(0, 24, (height, width), dtype=np.uint8)
    red = ((x + y) / 2).astype(np.uint8) + noise
    pixels = np.stack([red, np.broadcast_to(x.astype(np.uint8), red.shape), 255 - red], axis=-1)
    buffer = io.BytesIO()
    options = {"quality": 90} if fmt in ("JPEG", "WEBP") else {"compress_level": 6}
    Image.fromarray(pixels).save(buffer, fmt, **options)
    return buffer.getvalue()


CONFIG = {
    "output": [{"name": "PIXELS", "dims": [3, 224, 224]}],
    "parameters": {
        "formats": {"string_value": "JPEG,PNG,WEBP"},
        "resize_short_side": {"string_value": "256"},
        "mean": {"string_value": "127,127,127"},
        "std": {"string_value": "128,128,128"},
        "max_pixels": {"string_value": str(200_000_000)},
        "max_side": {"string_value": str(65_535)},
    },
}


def load_model(path: Path = MODEL / "1" / "model.py", name: str = "model") -> Any:
    """The real TritonPythonModel from ``path`` (a model.py), with the pb_utils calls
    initialize() makes faked, initialised with CONFIG."""
    fake = types.ModuleType("triton_python_backend_utils")
    fake.get_output_config_by_name = lambda config, name: next(  # type: ignore[attr-defined]
        o for o in config["output"] if o["name"] == name
    )
    fake.TritonModelException = RuntimeError  # type: ignore[attr-defined]
    sys.modules["triton_python_backend_utils"] = fake
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    instance = module.TritonPythonModel()
    instance.initialize({"model_config": json.dumps(CONFIG)})
    return instance


def one_case(path: Path) -> dict[str, float]:
    """In a fresh process: the image was made by the parent, so the peak is the decode's."""
    data = path.read_bytes()
    instance = load_model()
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS (VmHWM) to now
    before = _status_kib("VmRSS")
    started = time.perf_counter()
    instance._crop(data)
    seconds = time.perf_counter() - started
    return {"bytes": len(data), "ms": 1000 * seconds, "peak_mib": (_status_kib("VmHWM") - before) / 1024}


def _status_kib(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--megapixels", type=float, nargs="+", default=[1, 4, 12, 24, 40])
    parser.add_argument("--formats", nargs="+", default=["JPEG", "PNG", "WEBP"])
    parser.add_argument("--case", type=Path, help=argparse.SUPPRESS)  # internal: one case, JSON out
    options = parser.parse_args()
    if options.case:
        print(json.dumps(one_case(options.case)))
        return
    print(f"{'format':6} {'Mpx':>5} {'encoded':>10} {'decode ms':>10} {'peak MiB':>9}")
    for fmt in options.formats:
        for megapixels in options.megapixels:
            with tempfile.NamedTemporaryFile(suffix=f".{fmt.lower()}") as sample:
                sample.write(_image(fmt, megapixels))
                sample.flush()
                out = subprocess.run(
                    [sys.executable, __file__, "--case", sample.name],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            row = json.loads(out)
            print(
                f"{fmt:6} {megapixels:5.0f} {row['bytes'] / 2**20:8.1f} MiB {row['ms']:10.0f} {row['peak_mib']:9.0f}"
            )


if __name__ == "__main__":
    main()
