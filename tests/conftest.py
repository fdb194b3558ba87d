"""Shared fixtures. Integration fixtures (a real tritonserver) live in tests/integration."""

from __future__ import annotations

import sys
from pathlib import Path

# Make tests/support.py importable as `support` from every test folder.
sys.path.insert(0, str(Path(__file__).parent))

# Fixtures starting a real tritonserver; nothing starts until a test asks for one.
pytest_plugins = ["triton_fixtures"]
