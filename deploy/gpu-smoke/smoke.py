"""The first thing to run on a GPU host: bring up the compose GPU stack and check it in one go.

    make gpu-smoke                      # = python deploy/gpu-smoke/smoke.py --compose gpu --perf
    python deploy/gpu-smoke/smoke.py --url http://localhost:8080      # a stack already running
    python deploy/gpu-smoke/smoke.py --compose gpu --dry-run          # print what it would run

Checks, with a one-screen report at the end (exit 1 if any fails):
  - readiness (the first start includes the TensorRT build: up to --ready-timeout);
  - an image, a text, a text with candidate labels (each 200 with predictions);
  - every classifier of the catalog (GET /models: yours too) ready and answering by name
    (one unloaded on purpose is listed, not failed);
  - a corrupt-EXIF JPEG between two good photos: 422 naming input 2, and the two photos
    alone still 200 (one bad input never harms the others);
  - agreement with the CPU twin: top-1 of a fixed set of photos and texts against
    reference.json (written from the CPU stack with --write-reference), and the largest
    score drift (text scores are softmax(cosine / 0.05), so they show embedding drift
    amplified 20x); for the default models, and for every other catalogued model the
    reference has (a model of yours: --write-reference on a CPU stack serving it, then
    --reference that file on the GPU host);
  - with --perf: a short perf_analyzer run on each ensemble from NVIDIA's SDK image, on
    the stack's internal network (throughput and p99 latency).

Needs the project's dev environment (httpx, numpy, Pillow, scikit-image for the photos).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
COMPOSE_FILES = {
    "gpu": ["docker-compose.yml", "docker-compose.override.yml"],
    "cpu": ["docker-compose.yml", "docker-compose.cpu.yml"],
}
SDK_IMAGE = "nvcr.io/nvidia/tritonserver:25.08-py3-sdk"
PHOTOS = (
    "chelsea",
    "coffee",
    "astronaut",
    "rocket",
    "immunohistochemistry",
    "hubble_deep_field",
    "colorwheel",
)
TEXTS = (
    "The striker scored twice in the final minutes of the match.",
    "Parliament passed the budget after a long night of debate.",
    "The new phone has a faster chip and a brighter screen.",
    "Shares fell after the company missed its quarterly earnings forecast.",
    "Doctors recommend regular exercise and a balanced diet.",
    "The film won three awards at the festival, including best director.",
)
CONFIDENT = 0.3  # a reference top-1 above this must agree; below, FP16 may flip a near tie


def photo(name: str) -> bytes:
    from skimage import data

    pixels = np.asarray(getattr(data, name)())[..., :3]
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert("RGB").save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.lines.append(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail else ""))
        if not ok:
            self.failed.append(name)
        return ok

    def note(self, line: str) -> None:
        self.lines.append(f"      {line}")


def compose_command(variant: str, *args: str) -> list[str]:
    files = [part for name in COMPOSE_FILES[variant] for part in ("-f", str(ROOT / name))]
    return ["docker", "compose", *files, *args]


def run(command: list[str], dry_run: bool) -> None:
    print("$ " + shlex.join(command), flush=True)
    if not dry_run:
        subprocess.run(command, check=True, cwd=ROOT)


def wait_ready(client: httpx.Client, timeout: float, report: Report) -> bool:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if client.get("/readyz").status_code == 200:
                return report.check("ready", True, f"after {time.monotonic() - started:.0f} s")
        except httpx.TransportError:
            pass
        time.sleep(2)
    return report.check("ready", False, f"/readyz not 200 within {timeout:.0f} s")


def top1(response: httpx.Response) -> list[tuple[str, float]]:
    return [(r["predictions"][0]["label"], r["predictions"][0]["score"]) for r in response.json()["results"]]


def basic_checks(client: httpx.Client, report: Report) -> None:
    cat = photo("chelsea")
    answer = client.post("/classify", files={"file": ("cat.jpg", cat)})
    report.check(
        "image",
        answer.status_code == 200,
        f"{answer.status_code} {top1(answer) if answer.is_success else ''}",
    )
    answer = client.post("/classify", json={"text": TEXTS[0]})
    report.check(
        "text", answer.status_code == 200, f"{answer.status_code} {top1(answer) if answer.is_success else ''}"
    )
    answer = client.post(
        "/classify", json={"text": "Whisk the eggs with sugar.", "candidate_labels": ["cooking", "sport"]}
    )
    ok = answer.status_code == 200 and top1(answer)[0][0] == "cooking"
    report.check(
        "text with candidate labels", ok, f"{answer.status_code} {top1(answer) if answer.is_success else ''}"
    )
    corrupt = (HERE / "corrupt-exif.jpg").read_bytes()
    files = [("file", ("a.jpg", cat)), ("file", ("b.jpg", photo("coffee"))), ("file", ("c.jpg", corrupt))]
    answer = client.post("/classify", files=files)
    body = answer.json() if answer.headers.get("content-type", "").endswith("json") else {}
    report.check(
        "corrupt-EXIF image refused alone",
        answer.status_code == 422 and body.get("input_index") == 2,
        f"{answer.status_code} input_index={body.get('input_index')}",
    )
    answer = client.post("/classify", files=files[:2])
    report.check("the good photos beside it unharmed", answer.status_code == 200, str(answer.status_code))


def catalog_checks(client: httpx.Client, report: Report) -> None:
    """Every classifier of the catalog (GET /models), not only the shipped two: ready, and
    answering its kind's input by name with predictions."""
    listed = client.get("/models")
    models = listed.json().get("models", []) if listed.is_success else []
    report.check("catalog listed", listed.status_code == 200 and bool(models), f"{len(models)} classifier(s)")
    for model in models:
        name, task = model["name"], model["task"]
        if model.get("state") == "unloaded" and not model["default"]:
            report.note(f"catalog: {name} is unloaded (POST /admin/models/{name}/load to serve it)")
            continue
        route = f"/models/{name}/classify"
        if task == "image-classification":
            answer = client.post(route, files={"file": ("cat.jpg", photo("chelsea"))})
        else:
            answer = client.post(route, json={"text": TEXTS[0]})
        ok = model["ready"] and answer.status_code == 200 and bool(answer.json()["results"][0]["predictions"])
        report.check(
            f"catalog: {name}",
            ok,
            f"{task}, {answer.status_code} {top1(answer) if answer.is_success else ''}",
        )


def answers(client: httpx.Client) -> dict[str, Any]:
    """Top-1 of the photos and texts: the default models' (/classify) under "images" and
    "texts", every other catalogued model's (/models/NAME/classify) under "models"."""
    images = [("file", (f"{name}.jpg", photo(name))) for name in PHOTOS]
    image_answer = client.post("/classify", files=images)
    text_answer = client.post("/classify", json={"texts": list(TEXTS)})
    image_answer.raise_for_status()
    text_answer.raise_for_status()
    found: dict[str, Any] = {"images": top1(image_answer), "texts": top1(text_answer), "models": {}}
    listed = client.get("/models")
    listed.raise_for_status()
    for model in listed.json()["models"]:
        if model["default"] or not model["ready"]:
            continue
        route = f"/models/{model['name']}/classify"
        if model["task"] == "image-classification":
            answer = client.post(route, files=images)
        else:
            answer = client.post(route, json={"texts": list(TEXTS)})
        if answer.is_success:
            found["models"][model["name"]] = top1(answer)
    return found


def agree(
    name: str, found: list[tuple[str, float]], reference: list[tuple[str, float]], report: Report
) -> None:
    pairs = list(zip(found, reference, strict=True))
    same = sum(1 for (label, _), (ref, _) in pairs if label == ref)
    confident_misses = sum(
        1 for (label, _), (ref, ref_score) in pairs if label != ref and ref_score >= CONFIDENT
    )
    drift = max(abs(score - ref_score) for (_, score), (_, ref_score) in pairs)
    report.check(
        f"{name}: top-1 agrees with the CPU twin",
        confident_misses == 0,
        f"{same}/{len(pairs)}, {confident_misses} confident misses, largest score drift {drift:.4f}",
    )
    for (label, score), (ref, ref_score) in pairs:
        if label != ref:
            report.note(f"{name}: {label} {score:.3f} here, {ref} {ref_score:.3f} on the CPU twin")


def agreement(found: dict[str, Any], reference_file: Path, report: Report) -> None:
    reference = json.loads(reference_file.read_text())
    for kind in ("images", "texts"):
        agree(kind, found[kind], reference[kind], report)
    known = reference.get("models", {})
    for model, top in found["models"].items():
        if model in known:
            agree(model, top, known[model], report)
        else:
            report.note(
                f"{model}: no CPU reference in {reference_file.name} (run --write-reference on a CPU "
                "stack serving it, then pass that file with --reference)"
            )


def perf(variant: str, dry_run: bool, report: Report) -> None:
    """perf_analyzer from NVIDIA's SDK image on the stack's internal network."""
    project = os.environ.get("COMPOSE_PROJECT_NAME") or re.sub(r"[^a-z0-9_-]", "", ROOT.name.lower())
    network = f"{project}_backend"
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "image.json").write_text(
            json.dumps(
                {"data": [{"IMAGE": {"b64": base64.b64encode(photo("chelsea")).decode()}, "TOP_K": [5]}]}
            )
        )
        (Path(folder) / "text.json").write_text(json.dumps({"data": [{"TEXT": [TEXTS[0]], "TOP_K": [5]}]}))
        os.chmod(folder, 0o755)
        for model, data in (("image_classifier", "image.json"), ("text_classifier", "text.json")):
            command = [
                "docker", "run", "--rm", "--network", network, "-v", f"{folder}:/data:ro", SDK_IMAGE,
                "perf_analyzer", "-m", model, "-u", "triton:8001", "-i", "grpc", "--input-data", f"/data/{data}",
                "--concurrency-range", "8", "--measurement-interval", "5000",
            ]  # fmt: skip
            print("$ " + shlex.join(command), flush=True)
            if dry_run:
                continue
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            summary = [
                line.strip() for line in result.stdout.splitlines() if "Throughput" in line or "p99" in line
            ]
            report.check(
                f"perf_analyzer {model}",
                result.returncode == 0,
                "; ".join(summary[-2:]) or result.stderr[-200:],
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://localhost:8080")
    parser.add_argument("--compose", choices=["gpu", "cpu", "none"], default="none")
    parser.add_argument(
        "--perf", action="store_true", help="perf_analyzer on each ensemble (needs --compose)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the docker commands, run nothing")
    parser.add_argument("--ready-timeout", type=float, default=1800.0)
    parser.add_argument("--reference", type=Path, default=HERE / "reference.json")
    parser.add_argument(
        "--write-reference", action="store_true", help="record this stack's answers (CPU twin)"
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        default=HERE.parent / "secrets" / "smoke-key",
        help="an API key for the gateway (the compose stack has keys; `make keys` writes this one); "
        "none is sent when the file does not exist (a keyless local gateway)",
    )
    options = parser.parse_args(argv)
    key = options.key_file.read_text().strip() if options.key_file.is_file() else ""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    if options.compose != "none":
        run(compose_command(options.compose, "up", "-d", "--build"), options.dry_run)
    if options.dry_run:
        if options.perf and options.compose != "none":
            perf(options.compose, True, Report())
        return 0
    report = Report()
    with httpx.Client(base_url=options.url, timeout=120, headers=headers) as client:
        if wait_ready(client, options.ready_timeout, report):
            found = answers(client)
            if options.write_reference:
                options.reference.write_text(json.dumps(found, indent=1) + "\n")
                print(f"wrote {options.reference}")
                return 0
            basic_checks(client, report)
            catalog_checks(client, report)
            agreement(found, options.reference, report)
            if options.perf and options.compose != "none":
                perf(options.compose, False, report)
    print("\n".join(["", f"GPU smoke report for {options.url}", *report.lines, ""]))
    print("all checks passed" if not report.failed else f"FAILED: {', '.join(report.failed)}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
