"""The package rules, held by reading every module's imports (type-only ones included:
a circle through ``TYPE_CHECKING`` is still two modules that cannot be read apart).

- http/ is the skin: it may use everything below it, nothing uses it but the app.
- serving/ decides and runs inferences: never the HTTP skin, the model-repository
  tooling or the local launcher.
- triton/ and shared/ are boundaries (tritonclient and grpc's client side; redis): they
  import nothing above them, and nobody else imports those libraries.
- rpc/ is the gRPC door, a peer of http/: the server side of grpc and Triton's protos.
  Neither door imports the other; runtime (the composition root) builds what both share
  and starts rpc/; app builds the HTTP door over it.
- observe/ (metrics, tracing, logs) and the leaves (errors, settings, names) sit under all.
- No import circle between modules; no route module reads routing or rollout state.
- dev/ (the local launcher, and the processes the benchmark and the tests start) and bench/
  (`triton-gateway bench`) are tools: they may use anything; only the CLI imports bench/,
  which measures Triton directly with tritonclient (the one exception to its boundary).

What building the app loads at run time is checked in a fresh interpreter: tests/e2e/test_import_side_effects.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"

LEAVES = {
    "gateway",
    "gateway.errors",
    "gateway.jsoncodec",
    "gateway.names",
    "gateway.periodic",
    "gateway.settings",
}
# package -> the packages (and leaves) its modules may import
ALLOWED: dict[str, set[str]] = {
    "gateway.names": set(),
    "gateway.errors": set(),
    "gateway.jsoncodec": set(),
    "gateway.periodic": set(),
    "gateway.settings": {"gateway.names", "gateway.errors"},
    "gateway.observe": LEAVES,
    "gateway.triton": LEAVES | {"gateway.observe"},
    "gateway.shared": LEAVES | {"gateway.observe"},
    "gateway.serving": LEAVES | {"gateway.observe", "gateway.triton", "gateway.shared"},
    "gateway.http": LEAVES | {"gateway.observe", "gateway.triton", "gateway.shared", "gateway.serving"},
    "gateway.modelrepo": LEAVES | {"gateway.triton", "gateway.observe"},
    # the gRPC door: its protocol (service) and its work (door)
    "gateway.rpc": LEAVES | {"gateway.observe", "gateway.triton", "gateway.shared", "gateway.serving"},
    # the composition root: the services, and the gRPC door it starts beside the HTTP app
    "gateway.runtime": LEAVES
    | {"gateway.observe", "gateway.triton", "gateway.shared", "gateway.serving", "gateway.rpc"},
    # the HTTP door over the runtime's services
    "gateway.app": LEAVES | {"gateway.observe", "gateway.serving", "gateway.http", "gateway.runtime"},
}
# Foreign libraries and the packages allowed to import each (grpc: its client side in
# triton/, its server side in rpc/).
BOUNDARIES = {
    "tritonclient": ("gateway.triton", "gateway.rpc"),
    "grpc": ("gateway.triton", "gateway.rpc"),
    "grpc_health": ("gateway.rpc",),
    "google": ("gateway.triton", "gateway.rpc"),
    "redis": ("gateway.shared",),
    "orjson": ("gateway.jsoncodec",),
    "jwt": ("gateway.shared",),  # PyJWT: OpenID Connect tokens (gateway.shared.tokens)
    "cryptography": ("gateway.shared",),  # certificate names (gateway.shared.certificates)
}
TOOLS = {"gateway.dev", "gateway.bench"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names), wherever the import stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from gateway.modelrepo import labelfile` imports a module too
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _sources() -> list[Path]:
    """The package's modules (not what tools leave in hidden folders beneath it)."""
    return [
        p
        for p in PACKAGE.rglob("*.py")
        if not any(part.startswith(".") for part in p.relative_to(PACKAGE).parts)
    ]


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in _sources()}
    return {name: {m for m in _imports(path) if m in modules} for name, path in modules.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def test_every_module_belongs_to_a_package_with_rules() -> None:
    unruled = {
        m
        for m in _graph()
        if _package(m) not in ALLOWED and _package(m) not in TOOLS | {"gateway.__main__", "gateway"}
    }
    assert not unruled, f"modules outside the package rules: {sorted(unruled)}"


def test_packages_import_only_what_their_rules_allow() -> None:
    broken = []
    for module, imported in _graph().items():
        package = _package(module)
        if package not in ALLOWED:
            continue  # the launcher and the CLI may use anything
        allowed = ALLOWED[package] | {package}
        broken += [f"{module} -> {m}" for m in imported if _package(m) not in allowed and m not in allowed]
    assert not broken, "imports against the package rules:\n" + "\n".join(sorted(broken))


def test_foreign_libraries_have_one_boundary() -> None:
    broken = []
    for path in _sources():
        module = _module_name(path)
        for imported in _imports(path):
            owners = BOUNDARIES.get(imported.split(".")[0])
            if owners is not None and _package(module) not in (*owners, "gateway.bench"):
                broken.append(f"{module} imports {imported} (only {', '.join(owners)} may)")
    assert not broken, "\n".join(broken)


def test_only_the_cli_runs_the_benchmark() -> None:
    users = {
        module
        for module, imported in _graph().items()
        if _package(module) not in ("gateway.bench", "gateway.__main__")
        and any(_package(m) == "gateway.bench" for m in imported)
    }
    assert not users, f"the benchmark is imported by {sorted(users)}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    graph = _graph()
    # a package's __init__ importing its own modules is not a circle of ideas
    for module in graph:
        graph[module] = {m for m in graph[module] if not module.startswith(m + ".")}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("path", sorted((PACKAGE / "http" / "routes").glob("*.py")), ids=lambda p: p.name)
def test_routes_never_touch_routing_state(path: Path) -> None:
    """Which model, version, arm and top-k serve a request is decided beneath the routes."""
    imported = _imports(path)
    assert not {m for m in imported if m.startswith(("gateway.shared", "gateway.serving.rollout"))}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    touched = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in {"routing", "rollouts", "canary_for", "shadowed"}
    }
    assert not touched, f"{path.name} reads routing state: {sorted(touched)}"


ROUTES = PACKAGE / "http" / "routes"


@pytest.mark.parametrize("path", sorted(ROUTES.glob("*.py")), ids=lambda p: p.name)
def test_route_modules_never_import_each_other(path: Path) -> None:
    """A route reads, delegates and renders: what two routes share lives beneath them."""
    others = {f"gateway.http.routes.{p.stem}" for p in ROUTES.glob("*.py") if p != path}
    assert not _imports(path) & others, f"{path.name} imports {sorted(_imports(path) & others)}"


def test_neither_door_imports_the_other() -> None:
    graph = _graph()
    crossing = [
        f"{module} -> {m}"
        for module, imported in graph.items()
        for m in imported
        if (_package(module), _package(m))
        in {("gateway.http", "gateway.rpc"), ("gateway.rpc", "gateway.http")}
    ]
    assert not crossing, crossing


def test_only_the_app_imports_route_modules() -> None:
    """Code beneath the router (the protocol, the fast lane, the refusal from the head,
    authentication) takes paths from one table, gateway.http.paths, and is given what it
    calls: a route module is imported by the app that mounts it, and by nothing else."""
    graph = _graph()
    importing = sorted(
        f"{module} -> {m}"
        for module, imported in graph.items()
        for m in imported
        if m.startswith("gateway.http.routes")
        and module != "gateway.app"
        and not module.startswith("gateway.http.routes")
    )
    assert not importing, importing


def test_one_call_scope_beneath_both_doors() -> None:
    """What every call owes (its id, server span, in-flight gauge and outcome) is given
    by gateway.serving.scope: a door that records an outcome or opens a server span itself
    has a scope of its own, which the next door would not inherit."""
    defining = {"gateway.serving.scope", "gateway.observe.tracing", "gateway.observe.outcome"}
    owners = sorted(
        f"{module}: {what}"
        for path in _sources()
        if (module := _module_name(path)) not in defining and not module.startswith(tuple(TOOLS))
        for what in ("server_span(", "Outcome(", "in_flight.inc(")
        if what in path.read_text()
    )
    assert not owners, owners
