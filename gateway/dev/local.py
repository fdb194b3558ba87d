"""`triton-gateway local`: a real tritonserver on loopback plus the gateway, as one command.

Starts Triton (CPU, ``--model-config-name=cpu``; model control ``explicit`` with every
model loaded at start and its repository API restricted to a key made for this run, which
only the gateway holds; with OpenTelemetry tracing to the same collector when the
gateway's tracing is on) from the Triton environment, waits
until every model is loaded, points the gateway at it, serves, and on Ctrl-C or
SIGTERM shuts the gateway down gracefully and then Triton.

Nothing is left behind: Triton runs under a keeper (:mod:`gateway.dev.keeper`) that takes
its stubs and their shared memory with it, and dies with this process, SIGKILL included.
When Triton dies under a running launcher, the launcher reaps it, says so, stops the
gateway and exits with status 1 (the rule: restart the pair, `make run` again or the
service manager, rather than serve a gateway with no Triton behind it).
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from gateway.app import create_app
from gateway.dev.tritonserver import TritonServer
from gateway.http.server import GatewayServer, gateway_server, listen_sockets
from gateway.observe.tracing import triton_trace_args
from gateway.runtime import Runtime
from gateway.settings import Settings


@dataclass(frozen=True)
class LocalOptions:
    """What `triton-gateway local` is told on its command line."""

    host: str
    port: int
    triton_env: Path
    model_repository: Path
    workdir: Path
    ready_timeout: float = 120.0


def _say(message: str) -> None:
    print(f"[triton-gateway] {message}", file=sys.stderr, flush=True)


async def _watch(triton: TritonServer, server: GatewayServer, died: list[int]) -> None:
    """A Triton that dies (an OOM kill, a crash) is reaped at once and said so; the
    launcher then stops the gateway and exits non-zero, for whoever runs it to restart
    the pair (its keeper has already cleared Triton's stubs and their memory)."""
    while triton.running:  # noqa: ASYNC110 - a child process to poll, no event to await
        await asyncio.sleep(0.5)
    died.append(triton.exit_code or 0)
    _say(f"tritonserver exited unexpectedly ({_how(died[0])}): stopping the gateway")
    server.should_exit = True


def _how(code: int) -> str:
    if code > 128:
        try:
            return f"killed by {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"exit status {code}"


async def _serve(
    server: GatewayServer, runtime: Runtime, options: LocalOptions, settings: Settings, triton: TritonServer
) -> int:
    """The runtime (the services and the gRPC door) and, inside it, the HTTP server."""
    async with runtime.running():
        return await _serve_http(server, options, settings, triton)


async def _serve_http(
    server: GatewayServer, options: LocalOptions, settings: Settings, triton: TritonServer
) -> int:
    died: list[int] = []
    watcher = asyncio.create_task(_watch(triton, server, died))
    task = asyncio.create_task(server.serve(listen_sockets(settings, options.host, options.port)))
    # uvicorn exposes readiness only as a flag; poll it briefly.
    while not server.started and not task.done():  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    if server.started:
        base = f"http://{'localhost' if options.host in ('127.0.0.1', '0.0.0.0') else options.host}:{options.port}"
        _say(
            f"ready: API {base}/classify  docs {base}/docs  health {base}/readyz  "
            f"metrics {base}/metrics  (Ctrl-C stops)"
        )
        if settings.admin.keys_file is not None:
            where = f"{settings.admin.host}:{settings.admin.port}" if settings.admin.port else "the same port"
            _say(f"model control: /admin on {where}, admin keys from {settings.admin.keys_file}")
    await task
    watcher.cancel()
    return 1 if died else 0


class _StopRequestedError(Exception):
    """SIGINT or SIGTERM arrived; unwinds to run_local so Triton is always stopped."""


def _on_stop_signal(signum: int, frame: object) -> None:
    raise _StopRequestedError(signum)


def run_local(settings: Settings, options: LocalOptions) -> int:
    repository_key = secrets.token_urlsafe(32)
    triton = TritonServer.on_free_ports(
        options.triton_env,
        options.model_repository,
        options.workdir,
        model_control_mode="explicit",
        load_models=("*",),
        repository_key=repository_key,
        extra_args=tuple(triton_trace_args(settings.tracing)),  # none unless tracing is on
    )
    # uvicorn handles the signal while serving (graceful shutdown), then re-raises it
    # once done: these handlers turn that into an orderly return instead of a kill.
    previous = {sig: signal.signal(sig, _on_stop_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    _say(f"starting tritonserver (CPU) on {triton.grpc_url}; log: {triton.log_file}")
    try:
        triton.start()
        triton.wait_ready(options.ready_timeout)
        _say("tritonserver is ready (all models loaded)")
        local_triton = {
            "url": triton.grpc_url,
            "metrics_url": triton.metrics_url,
            "repository_key": SecretStr(repository_key),
        }
        settings = settings.model_copy(update={"triton": settings.triton.model_copy(update=local_triton)})
        runtime = Runtime(settings)
        server = gateway_server(create_app(settings, runtime=runtime), settings, options.host, options.port)
        status = asyncio.run(_serve(server, runtime, options, settings, triton))
    except _StopRequestedError:
        status = 0
    finally:
        _say("stopping tritonserver")
        triton.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _say("stopped")
    return status
