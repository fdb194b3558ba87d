"""The serving import graph: the app and its Triton boundary load neither the local-stack
launcher (tritonserver.py, local.py), nor add-model's repository writer (and its onnx
and protobuf config boundaries), nor, until the lifespan builds the backend,
tritonclient."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from gateway.app import create_app
from gateway.settings import Settings
create_app(Settings())
print(' '.join(sorted(m for m in sys.modules if m.startswith(('gateway.', 'tritonclient')))))
import gateway.triton.client
print(' '.join(sorted(m for m in sys.modules if m.startswith('gateway.'))))
"""


def test_serving_does_not_import_the_launcher() -> None:
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    app_only, with_triton = (line.split() for line in run.stdout.splitlines())
    assert "gateway.app" in app_only
    assert not [m for m in app_only if m.startswith("tritonclient")]
    for loaded in (app_only, with_triton):
        assert "gateway.tritonserver" not in loaded
        assert "gateway.local" not in loaded
        for writer in ("gateway.modelrepo", "gateway.imageentry", "gateway.onnxgraph", "gateway.pbtxt"):
            assert writer not in loaded
    assert "gateway.triton" in with_triton
