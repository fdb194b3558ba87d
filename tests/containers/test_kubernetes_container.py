"""The gateway image run as the Kubernetes manifests run it (read-only root filesystem,
/tmp a tmpfs, uid 10001, every capability dropped, no privilege escalation, the memory
limit, the ConfigMap's settings, the keys Secret mounted where the Deployment mounts it),
probed as they probe it, classifying against the Triton image on CPU."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.dev.tritonserver import free_ports
from gateway.shared.keyfiles import hash_key

from helpers.containers import ROOT, Containers
from helpers.support import chelsea_jpeg


def _rendered() -> list[dict[str, Any]]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "deploy" / "k8s" / "cpu")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _until(url: str, seconds: float, containers: Containers, name: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer 200 in {seconds:.0f} s:\n{containers.logs(name)}")


def test_the_gateway_image_serves_as_kubernetes_runs_it(
    gateway_image: str, triton_image: str, containers: Containers, tmp_path: Path
) -> None:
    docs = _rendered()
    deployment = _find(docs, "Deployment", "gateway")
    pod = deployment["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "gateway")
    security = {**pod["securityContext"], **container["securityContext"]}
    settings = dict(_find(docs, "ConfigMap", "gateway-settings")["data"])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert security["readOnlyRootFilesystem"]
    assert not security["allowPrivilegeEscalation"]
    assert security["capabilities"]["drop"] == ["ALL"]

    # Triton on CPU, the Triton image's own user, the shipped repository read-only
    grpc, http, metrics = free_ports(3)
    containers.run(
        "tg-test-triton", triton_image, "--network", "host", "--shm-size", "1g",
        "-v", f"{ROOT / 'model_repository'}:/models:ro",
        command=[
            "--model-repository=/models", "--model-config-name=cpu", "--model-control-mode=explicit",
            "--load-model=*", f"--grpc-port={grpc}", f"--http-port={http}", f"--metrics-port={metrics}",
            "--exit-timeout-secs=5",
        ],
    )  # fmt: skip
    _until(f"http://127.0.0.1:{http}/v2/health/ready", 180, containers, "tg-test-triton")

    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "keys").write_text(f"client {hash_key('k8s-client-secret')}\n")
    keys.chmod(0o755)
    (keys / "keys").chmod(0o644)
    port, door = free_ports(2)
    settings |= {
        # the Services' names resolve in a cluster; here, Triton's loopback ports
        "GATEWAY_TRITON__URL": f"127.0.0.1:{grpc}",
        "GATEWAY_TRITON__METRICS_URL": f"http://127.0.0.1:{metrics}/metrics",
        "GATEWAY_PORT": str(port),
        "GATEWAY_GRPC__PORT": str(door),
    }
    environment = [arg for key, value in settings.items() for arg in ("-e", f"{key}={value}")]
    memory = container["resources"]["limits"]["memory"].replace("Gi", "g").replace("Mi", "m")
    containers.run(
        "tg-test-gateway", gateway_image, "--network", "host",
        "--read-only", "--tmpfs", "/tmp", "--user", f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}",
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--memory", memory,
        "-v", f"{keys}:{mounts['api-keys']}:ro", *environment,
        command=container["args"],
    )  # fmt: skip
    probes = {name: container[name]["httpGet"]["path"] for name in ("livenessProbe", "readinessProbe")}
    base = f"http://127.0.0.1:{port}"
    _until(base + probes["livenessProbe"], 60, containers, "tg-test-gateway")
    _until(base + probes["readinessProbe"], 60, containers, "tg-test-gateway")

    key = {"Authorization": "Bearer k8s-client-secret"}
    answer = httpx.post(
        f"{base}/classify", content=chelsea_jpeg(), headers={**key, "Content-Type": "image/jpeg"}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    labels = [p["label"] for p in answer.json()["results"][0]["predictions"]]
    assert any("cat" in label for label in labels[:3]), labels
    assert httpx.post(f"{base}/classify", content=chelsea_jpeg(), timeout=30).status_code == 401
    # a multipart body spools to /tmp past 1 MiB: the tmpfs takes it on a read-only root
    big = chelsea_jpeg() + b"\0" * (2 * 1024 * 1024)
    spooled = httpx.post(
        f"{base}/classify", files={"file": ("cat.jpg", big, "image/jpeg")}, headers=key, timeout=30
    )
    assert spooled.status_code in (200, 413, 422), spooled.text
