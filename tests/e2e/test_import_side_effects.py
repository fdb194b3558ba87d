"""At run time, in a fresh interpreter: building the app loads neither the launcher, nor
add-model's writer, nor tritonclient (until the lifespan builds the backend). (The import
rules themselves: tests/unit/test_import_graph.py.)"""

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
    assert "gateway.serving.dispatch" in app_only
    assert not [m for m in app_only if m.startswith("tritonclient")]
    for loaded in (app_only, with_triton):
        assert not [m for m in loaded if m.startswith(("gateway.dev", "gateway.modelrepo"))]
        assert "gateway.triton.pbtxt" not in loaded
    assert "gateway.triton.client" in with_triton
