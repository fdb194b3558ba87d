"""The heap tuning: large buffers freed and allocated again reuse pages already mapped
(minor page faults counted by the kernel, in a fresh process each: mallopt is for life)."""

from __future__ import annotations

import json
import subprocess
import sys

PROGRAM = """
import json, os, resource, sys
from gateway.serving.heap import keep_heap
took = keep_heap(int(sys.argv[1]))
image = os.urandom(220 * 1024)
body = image * 8
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):  # warm
    parts = [body[i * len(image):(i + 1) * len(image)] for i in range(8)]
    del parts
before = faults()
for _ in range(200):  # an 8-image request's buffers, made and freed
    parts = [body[i * len(image):(i + 1) * len(image)] for i in range(8)]
    del parts
print(json.dumps({"took": took, "faults": faults() - before}))
"""


def faults(keep_bytes: int) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(keep_bytes)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    found: dict[str, int] = json.loads(out.stdout)
    return found


def test_kept_heap_serves_the_next_images_without_faulting_their_pages_in() -> None:
    default, kept = faults(0), faults(128 * 1024 * 1024)
    assert not default["took"]
    assert kept["took"]  # glibc: this machine's and the images'
    # glibc maps each 220 KiB block and unmaps it on free: ~55 faults a block, 88,000 here
    assert default["faults"] > 8 * 200 * 10
    assert kept["faults"] < default["faults"] / 20
