"""Deployment files, validated offline: compose (both variants), Kubernetes manifests,
Dockerfiles, and the TensorRT build commands against the exported ONNX models."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCKERFILES = sorted(ROOT.glob("deploy/*/Dockerfile"))

pytestmark = pytest.mark.e2e


def tool(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(found).exists():
        pytest.fail(f"{name} is not installed: `make test` installs it")
    return found


def compose_config(*files: str) -> dict[str, Any]:
    args = [tool("docker-compose"), "--project-directory", str(ROOT)]
    for name in files:
        args += ["-f", str(ROOT / name)]
    quiet = subprocess.run([*args, "config", "-q"], capture_output=True, text=True)
    assert quiet.returncode == 0, quiet.stderr
    rendered = subprocess.run([*args, "config"], capture_output=True, text=True, check=True)
    config: dict[str, Any] = yaml.safe_load(rendered.stdout)
    return config


GPU = ("docker-compose.yml", "docker-compose.override.yml")
CPU = ("docker-compose.yml", "docker-compose.cpu.yml")


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = (
        service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    )
    return devices


@pytest.mark.parametrize("files", [GPU, CPU], ids=["gpu", "cpu"])
def test_compose_stack_is_valid_and_wired(files: tuple[str, ...]) -> None:
    services = compose_config(*files)["services"]
    assert set(services) == {"model-build", "triton", "gateway", "prometheus", "grafana"}
    triton = services["triton"]
    assert "ports" not in triton, "Triton must not be published to the host"
    assert set(triton["networks"]) == {"backend"}
    assert triton["depends_on"]["model-build"]["condition"] == "service_completed_successfully"
    assert "/v2/health/ready" in " ".join(triton["healthcheck"]["test"])
    gateway = services["gateway"]
    assert gateway["depends_on"]["triton"]["condition"] == "service_healthy"
    assert "/livez" in " ".join(gateway["healthcheck"]["test"])
    assert set(gateway["networks"]) == {"backend", "frontend"}
    assert services["grafana"]["ports"][0]["published"] in (3000, "3000")
    for name in ("prometheus", "grafana"):
        assert services[name]["user"] not in ("0", "root", "0:0")
        assert re.search(r":v?\d+\.\d+\.\d+$", services[name]["image"]), services[name]["image"]


def test_gpu_variant_reserves_gpus_and_runs_tensorrt() -> None:
    services = compose_config(*GPU)["services"]
    for name in ("model-build", "triton"):
        assert gpu_devices(services[name])[0]["driver"] == "nvidia"
    assert not any("--model-config-name" in arg for arg in services["triton"]["command"])


def test_cpu_variant_needs_no_gpu() -> None:
    services = compose_config(*CPU)["services"]
    assert all(gpu_devices(service) == [] for service in services.values())
    assert "--model-config-name=cpu" in services["triton"]["command"]
    assert services["model-build"]["command"] == ["/models", "--cpu"]


def test_backend_network_is_internal() -> None:
    config = compose_config(*GPU)
    assert config["networks"]["backend"]["internal"] is True


def test_no_secrets_in_compose_files() -> None:
    secret = re.compile(r"(PASSWORD|SECRET|TOKEN|API_KEY)[A-Z_]*:\s*(.+)")
    for path in ROOT.glob("docker-compose*.yml"):
        for line in path.read_text().splitlines():
            match = secret.search(line)
            if match:
                assert match.group(2).strip().startswith("${"), f"{path.name}: {line.strip()}"


# --- Dockerfiles ---------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint(dockerfile: Path) -> None:
    result = subprocess.run([tool("hadolint"), "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_pins_base_and_runs_as_non_root(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.MULTILINE))
    for image in re.findall(r"^FROM (\S+)", text, re.MULTILINE):
        image = args.get(image.strip("${}"), image)
        assert re.search(r":\d+[\w.\-]*$", image), f"{dockerfile}: base image {image} is not pinned"
        assert not image.endswith(":latest")
    users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert users, f"{dockerfile}: no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit()
    assert int(uid) != 0


def test_gateway_image_has_healthcheck_and_no_build_tools() -> None:
    text = (ROOT / "deploy" / "gateway" / "Dockerfile").read_text()
    final_stage = text.split("\nFROM ")[-1]
    assert "HEALTHCHECK" in final_stage
    assert "/livez" in final_stage
    assert "apt-get" not in final_stage
    for forbidden in ("gcc", "build-essential", "ghostscript"):
        assert forbidden not in final_stage
    assert "HEALTHCHECK" in (ROOT / "deploy" / "triton" / "Dockerfile").read_text()


def test_triton_image_is_recent_enough() -> None:
    # Triton before 25.08 has a known remote-code-execution flaw in the model control API.
    for path in [ROOT / "docker-compose.yml", *DOCKERFILES]:
        for year, month in re.findall(r"tritonserver:(\d\d)\.(\d\d)", path.read_text()):
            assert (int(year), int(month)) >= (25, 8), path


# --- Kubernetes ------------------------------------------------------------------------


def rendered(overlay: str) -> list[tuple[Path, dict[str, Any]]]:
    """What `kubectl apply -k deploy/k8s/<overlay>` applies: kustomization resources, recursively."""

    def walk(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
        documents: list[tuple[Path, dict[str, Any]]] = []
        for entry in kustomization["resources"]:
            target = (folder / entry).resolve()
            if target.is_dir():
                documents += walk(target)
            else:
                assert target.exists(), f"{folder}/kustomization.yaml names missing {entry}"
                documents += [(target, doc) for doc in yaml.safe_load_all(target.read_text()) if doc]
        return documents

    return walk(K8S / overlay)


def by_kind(documents: list[tuple[Path, dict[str, Any]]], kind: str, name: str) -> dict[str, Any]:
    found = [doc for _, doc in documents if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def test_every_manifest_passes_strict_validation() -> None:
    files = sorted(path for path in K8S.rglob("*.yaml") if path.name != "kustomization.yaml")
    result = subprocess.run(
        [tool("kubernetes-validate"), "--strict", "--quiet", *map(str, files)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in result.stdout.splitlines() if line.strip()]
    # The Prometheus Operator's CRD has no published schema here: checked below instead.
    assert all("servicemonitor.yaml" in line for line in warnings), warnings


@pytest.mark.parametrize("overlay", ["gpu", "cpu"])
def test_overlay_renders_a_complete_stack(overlay: str) -> None:
    documents = rendered(overlay)
    kinds = sorted({doc["kind"] for _, doc in documents})
    assert kinds == sorted(
        {
            "Namespace", "ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler",
            "PodDisruptionBudget", "PersistentVolumeClaim", "NetworkPolicy", "ServiceMonitor", "Job",
        }
    )  # fmt: skip
    gateway = by_kind(documents, "Deployment", "gateway")
    pod = gateway["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["terminationGracePeriodSeconds"] >= 15
    assert (
        by_kind(documents, "HorizontalPodAutoscaler", "gateway")["spec"]["scaleTargetRef"]["name"]
        == "gateway"
    )
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    pdb = by_kind(documents, "PodDisruptionBudget", "gateway")["spec"]["selector"]["matchLabels"]
    assert pdb.items() <= labels.items()

    triton = by_kind(documents, "Deployment", "triton")
    triton_labels = triton["spec"]["template"]["metadata"]["labels"]
    policy = by_kind(documents, "NetworkPolicy", "triton-only-from-gateway")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= triton_labels.items()
    (rule,) = policy["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= labels.items()
    assert not source["podSelector"]["matchLabels"].items() <= triton_labels.items()

    limits = triton["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    args = triton["spec"]["template"]["spec"]["containers"][0]["args"]
    if overlay == "gpu":
        assert limits["nvidia.com/gpu"] == 1
        assert not any(arg.startswith("--model-config-name") for arg in args)
    else:
        assert "nvidia.com/gpu" not in limits
        assert any(arg.startswith("--model-config-name=cpu") for arg in args)

    monitor = by_kind(documents, "ServiceMonitor", "triton-gateway")["spec"]
    service = by_kind(documents, "Service", "gateway")
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["endpoints"][0]["port"] in [port["name"] for port in service["spec"]["ports"]]
    assert monitor["endpoints"][0]["path"] == "/metrics"


# --- TensorRT build commands vs the ONNX models -------------------------------------------


def trtexec_plans() -> list[tuple[str, str, str, str, str]]:
    text = (ROOT / "deploy" / "model-build" / "trtexec.sh").read_text()
    block = re.search(r"^plans=\((.*?)^\)", text, re.MULTILINE | re.DOTALL)
    assert block is not None
    return [tuple(entry.split("|")) for entry in shlex.split(block.group(1), comments=True)]  # type: ignore[misc]


def config_value(model: str, key: str, config: str = "config.pbtxt") -> str:
    text = (ROOT / "model_repository" / model / config).read_text()
    match = re.search(rf"^{key}: (\S+)", text, re.MULTILINE)
    assert match is not None, (model, key)
    return match.group(1).strip('"')


def test_trtexec_shapes_match_the_onnx_models() -> None:
    import onnx

    plans = trtexec_plans()
    assert [plan[0] for plan in plans] == ["image_model", "text_model"]
    for name, inputs, low, best, high in plans:
        assert config_value(name, "platform") == "tensorrt_plan"
        path = ROOT / "model_repository" / name / "1" / "model.onnx"
        if not path.exists():
            pytest.fail(f"{path} is missing: run `make models`")
        graph = onnx.load(str(path), load_external_data=False).graph
        onnx_inputs = {
            i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
            for i in graph.input
        }
        names = [part.split(":")[0] for part in inputs.split(",")]
        assert sorted(names) == sorted(onnx_inputs), (name, names, onnx_inputs)
        shapes = [[int(v) for v in shape.split("x")] for shape in (low, best, high)]
        for input_name in names:
            dims = onnx_inputs[input_name]
            for shape in shapes:
                assert len(shape) == len(dims), (name, input_name, shape, dims)
                for want, fixed in zip(shape, dims, strict=True):
                    assert fixed is None or want == fixed, (name, input_name, shape, dims)
            assert dims[0] is None, "the batch axis must be dynamic"
        assert all(lo <= mid <= hi for lo, mid, hi in zip(*shapes, strict=True))
        assert shapes[2][0] == int(config_value(name, "max_batch_size"))
    # The text profile's longest sequence is the tokenizer's truncation length.
    text_plan = next(plan for plan in plans if plan[0] == "text_model")
    tokenizer_config = (ROOT / "model_repository" / "text_tokenize" / "config.pbtxt").read_text()
    max_tokens = re.search(r'key: "max_tokens" value: \{ string_value: "(\d+)" \}', tokenizer_config)
    assert max_tokens is not None
    assert int(text_plan[4].split("x")[1]) == int(max_tokens.group(1))
