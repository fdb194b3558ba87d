"""The HTTP door's path table: every path and path shape that code beneath the router
needs (the protocol's refusal from the head, the fast lane, authentication, compression,
the error forms), named once. Route modules declare their routes with these names, and
nothing below the router imports a route module: a new route is added here and there.
"""

from __future__ import annotations

import re

# the classify routes (gateway.http.routes.classify; served beneath the router by
# gateway.http.fastlane)
CLASSIFY = "/classify"
CLASSIFY_MODEL = "/models/{model}/classify"
CLASSIFY_VERSION = "/models/{model}/versions/{version}/classify"
# path -> (model, version); the segments as FastAPI's {param} matches them
CLASSIFY_PATH = re.compile(r"/(?:classify|models/([^/]+)/(?:versions/([^/]+)/)?classify)")

# the Open Inference Protocol's door (gateway.http.routes.oip, under OIP_PREFIX)
OIP_PREFIX = "/v2"
INFER = "/v2/models/{model_name}/infer"
INFER_VERSION = "/v2/models/{model_name}/versions/{model_version}/infer"
OIP_INFER_PATH = re.compile(r"/v2/models/([^/]+)/(?:versions/([^/]+)/)?infer")

# the task routes in OpenAI's and vLLM's shapes (gateway.http.routes.openai, under TASK_PREFIX)
TASK_PREFIX = "/v1"
TASK_CLASSIFY = "/v1/classify"
TASK_EMBEDDINGS = "/v1/embeddings"
TASK_ROUTES = frozenset({TASK_CLASSIFY, TASK_EMBEDDINGS})  # those that refuse from the headers

# open to probes whatever the keys (a known caller is told more: gateway.http.routes.health)
ALWAYS_OPEN = frozenset({"/livez", "/readyz", "/v2/health/live", "/v2/health/ready"})
METRICS = "/metrics"
DOCS_PREFIXES = ("/docs", "/redoc", "/openapi.json")
ADMIN_PREFIX = "/admin/"


def classify_template(model: str | None, version: str | None) -> str:
    """The route template a classify request with these path parameters matches."""
    if model is None:
        return CLASSIFY
    return CLASSIFY_MODEL if version is None else CLASSIFY_VERSION


def relative(path: str, prefix: str) -> str:
    """``path`` as its router (mounted at ``prefix``) declares it."""
    return path.removeprefix(prefix)


def on_oip_door(path: str) -> bool:
    return path == OIP_PREFIX or path.startswith(OIP_PREFIX + "/")


def on_task_door(path: str) -> bool:
    return path.startswith(TASK_PREFIX + "/")


def is_oip_infer(path: str) -> bool:
    return path.startswith(OIP_PREFIX + "/") and path.endswith("/infer")
