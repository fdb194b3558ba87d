"""Deployment files, validated offline: compose (both variants), Kubernetes manifests,
Dockerfiles, and the TensorRT build commands against the exported ONNX models."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from gateway.settings import Settings

from helpers.support import load_script

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCKERFILES = sorted(ROOT.glob("deploy/*/Dockerfile"))


def tool(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(found).exists():
        pytest.fail(f"{name} is not installed: `make test` installs it")
    return found


def compose_config(*files: str) -> dict[str, Any]:
    args = [tool("docker-compose"), "--project-directory", str(ROOT)]
    for name in files:
        args += ["-f", str(ROOT / name)]
    env = {  # required by the files
        **os.environ,
        "GRAFANA_ADMIN_PASSWORD": "a-test-password",
        "TRITON_REPOSITORY_KEY": "a-test-key",
        "REDIS_PASSWORD": "a-redis-password",
        "ADMIN_KEYS_FILE": str(ROOT / "README.md"),  # any existing file
    }
    quiet = subprocess.run([*args, "config", "-q"], capture_output=True, text=True, env=env)
    assert quiet.returncode == 0, quiet.stderr
    rendered = subprocess.run([*args, "config"], capture_output=True, text=True, check=True, env=env)
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
    assert set(services) == {
        "model-build",
        "triton",
        "gateway",
        "proxy",
        "prometheus",
        "grafana",
        "jaeger",
        "redis",
    }
    triton = services["triton"]
    assert "ports" not in triton, "Triton must not be published to the host"
    assert set(triton["networks"]) == {"backend"}
    assert triton["depends_on"]["model-build"]["condition"] == "service_completed_successfully"
    assert "/v2/health/ready" in " ".join(triton["healthcheck"]["test"])
    gateway = services["gateway"]
    assert gateway["depends_on"]["triton"]["condition"] == "service_healthy"
    assert "/livez" in " ".join(gateway["healthcheck"]["test"])
    assert set(gateway["networks"]) == {"backend", "frontend"}
    # Replicas behind the proxy, which alone is published; none merges Triton's metrics.
    assert gateway["deploy"]["replicas"] == 2
    assert "ports" not in gateway
    assert gateway["environment"]["GATEWAY_TRITON__METRICS_URL"] == ""
    # The shared state: Redis with a password, on the backend network only, never published.
    redis = services["redis"]
    assert "ports" not in redis
    assert set(redis["networks"]) == {"backend"}
    # its password in its environment and a config file, never on a command line
    assert "a-redis-password" not in " ".join(redis["command"])
    assert redis["environment"]["REDISCLI_AUTH"] == "a-redis-password"
    # Secure by default: every replica has keys; Prometheus scrapes with its own
    assert gateway["environment"]["GATEWAY_AUTH__KEYS_FILE"] == "/run/secrets/api-keys"
    assert gateway["secrets"] == ["api-keys"] or gateway["secrets"][0].get("source") == "api-keys"
    assert "prometheus-key" in str(services["prometheus"]["secrets"])
    assert gateway["environment"]["GATEWAY_REDIS__URL"] == "redis://:a-redis-password@redis:6379/0"
    assert gateway["environment"]["GATEWAY_REDIS__REPLICAS"] == str(gateway["deploy"]["replicas"])
    assert gateway["depends_on"]["redis"]["condition"] == "service_healthy"
    assert re.search(r":\d+\.\d+\.\d+-alpine$", redis["image"]), redis["image"]
    proxy = services["proxy"]
    # the HTTP port and the gRPC door: nothing else is published
    published = sorted(str(p.get("target", p)) if isinstance(p, dict) else p for p in proxy["ports"])
    assert published in (["8001", "8080"], ["8001:8001", "8080:8080"]), proxy["ports"]
    assert gateway["environment"]["GATEWAY_GRPC__PORT"] == "8001"
    assert proxy["environment"]["GATEWAY_GRPC_PORT"] == "8001"
    assert proxy["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert proxy["environment"]["GATEWAY_HOST"] == "gateway"
    assert set(proxy["networks"]) == {"frontend"}
    # The drain (delay + grace + uvicorn's 5 s) fits before compose's SIGKILL.
    env = gateway["environment"]
    stop = int(str(gateway["stop_grace_period"]).removesuffix("s"))
    settings = Settings(server={"drain_delay_seconds": env["GATEWAY_SERVER__DRAIN_DELAY_SECONDS"]})
    assert stop >= settings.server.drain_delay_seconds + settings.server.shutdown_grace_seconds + 5
    assert set(services["prometheus"]["networks"]) == {"backend", "frontend"}  # scrapes Triton
    grafana_port = services["grafana"]["ports"][0]
    # Published on loopback only (compose 1.29 renders a host IP as "ip:host:container").
    assert grafana_port in ("127.0.0.1:3000:3000", "127.0.0.1:3000:3000/tcp") or (
        grafana_port["published"] in (3000, "3000") and grafana_port.get("host_ip") == "127.0.0.1"
    ), grafana_port
    # model-build writes into the bind-mounted checkout: as MODEL_BUILD_USER, else 1000:1000.
    assert services["model-build"]["user"] == "1000:1000"
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


@pytest.mark.parametrize("files", [GPU, CPU], ids=["gpu", "cpu"])
def test_compose_triton_takes_model_control_only_from_the_gateway(files: tuple[str, ...]) -> None:
    services = compose_config(*files)["services"]
    command = services["triton"]["command"]
    assert "--model-control-mode=explicit" in command
    assert "--load-model=*" in command
    restricted = "model-repository,shared-memory,trace,logging:triton-gateway-admin-key=a-test-key"
    assert f"--grpc-restricted-protocol={restricted}" in command
    assert f"--http-restricted-api={restricted}" in command
    assert services["gateway"]["environment"]["GATEWAY_TRITON__REPOSITORY_KEY"] == "a-test-key"
    # no admin surface unless docker-compose.admin.yml is added
    assert not any(k.startswith("GATEWAY_ADMIN__") for k in services["gateway"]["environment"])


def test_compose_admin_file_publishes_admin_on_loopback_only() -> None:
    services = compose_config(*GPU, "docker-compose.admin.yml")["services"]
    env = services["gateway"]["environment"]
    assert env["GATEWAY_ADMIN__KEYS_FILE"] == "/run/secrets/admin-keys"
    assert env["GATEWAY_ADMIN__PORT"] == services["proxy"]["environment"]["GATEWAY_ADMIN_PORT"] == "8081"
    admin = [p for p in services["proxy"]["ports"] if "8081" in str(p)]
    assert len(admin) == 1
    port = admin[0]
    assert port in ("127.0.0.1:8081:8081", "127.0.0.1:8081:8081/tcp") or (
        isinstance(port, dict) and port.get("host_ip") == "127.0.0.1"
    ), port


def test_backend_network_is_internal() -> None:
    config = compose_config(*GPU)
    assert config["networks"]["backend"]["internal"] is True


def test_no_secrets_in_compose_files() -> None:
    """Every secret comes from a ${...} substitution: with those taken out of each line,
    nothing that looks like a secret keeps a value (nor a URL a password)."""
    secret = re.compile(r"(PASSWORD|SECRET|TOKEN|API_KEY|CLI_AUTH)[A-Z_]*:\s*(\S.*)")
    url_password = re.compile(r"://[^/@\s]*:[^/@\s]+@")
    for path in ROOT.glob("docker-compose*.yml"):
        for line in path.read_text().splitlines():
            literal = re.sub(r"\$\{[^}]*\}", "", line.split(" #", 1)[0])
            assert not secret.search(literal), f"{path.name}: {line.strip()}"
            assert not url_password.search(literal), f"{path.name}: {line.strip()}"


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


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is not installed (our machines have it; kustomize is built in)")
    return found


def rendered(overlay: str, components: tuple[str, ...] = ()) -> list[tuple[Path, dict[str, Any]]]:
    """What `kubectl apply -k deploy/k8s/<overlay>` applies, rendered by `kubectl kustomize`
    itself; with ``components`` (paths relative to the overlay) added the way a user opts
    in: a kustomization of their own naming the overlay and the components."""
    folder = K8S / overlay
    with tempfile.TemporaryDirectory() as scratch:
        if components:
            mine = Path(scratch) / "mine"
            mine.mkdir()
            (mine / "kustomization.yaml").write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "kustomize.config.k8s.io/v1beta1",
                        "kind": "Kustomization",
                        "resources": [os.path.relpath(folder, mine)],
                        "components": [os.path.relpath((folder / c).resolve(), mine) for c in components],
                    }
                )
            )
            folder = mine
        result = subprocess.run(
            [kubectl(), "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(folder)],
            capture_output=True,
            text=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    documents = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return [(Path(f"{doc['kind']}-{doc['metadata']['name']}"), doc) for doc in documents]


def by_kind(documents: list[tuple[Path, dict[str, Any]]], kind: str, name: str) -> dict[str, Any]:
    found = [doc for _, doc in documents if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


@pytest.mark.parametrize("overlay", ["gpu", "cpu"])
def test_every_manifest_passes_strict_validation(overlay: str, tmp_path: Path) -> None:
    """The overlay as applied (base plus its patches), one file per document."""
    files = []
    for index, (source, document) in enumerate(rendered(overlay, ("../components/servicemonitor",))):
        files.append(tmp_path / f"{index:02d}-{source.stem}-{document['kind']}.yaml")
        files[-1].write_text(yaml.safe_dump(document))
    result = subprocess.run(
        [tool("kubernetes-validate"), "--strict", "--quiet", *map(str, files)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in result.stdout.splitlines() if line.strip()]
    # The Prometheus Operator's CRD has no published schema here: checked below instead.
    assert all("ServiceMonitor" in line for line in warnings), warnings


@pytest.mark.parametrize("overlay", ["gpu", "cpu"])
def test_overlay_renders_a_complete_stack(overlay: str) -> None:
    documents = rendered(overlay)
    kinds = sorted({doc["kind"] for _, doc in documents})
    assert kinds == sorted(
        {
            "Namespace", "ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler",
            "PodDisruptionBudget", "PersistentVolumeClaim", "NetworkPolicy",
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

    # The shared state: Redis reachable from gateway pods only, its password from a Secret
    # (defined before the URL that expands it), the fallback divisor the HPA's maximum.
    redis = by_kind(documents, "Deployment", "redis")["spec"]["template"]
    guard = by_kind(documents, "NetworkPolicy", "redis-only-from-gateway")["spec"]
    assert guard["podSelector"]["matchLabels"].items() <= redis["metadata"]["labels"].items()
    (rule,) = guard["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= labels.items()
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    env = [item["name"] for item in container["env"]]
    assert env.index("REDIS_PASSWORD") < env.index("GATEWAY_REDIS__URL")
    url = next(item["value"] for item in container["env"] if item["name"] == "GATEWAY_REDIS__URL")
    assert url == "redis://:$(REDIS_PASSWORD)@redis:6379/0"
    assert by_kind(documents, "Service", "redis")["spec"]["ports"][0]["port"] == 6379
    settings = by_kind(documents, "ConfigMap", "gateway-settings")["data"]
    hpa = by_kind(documents, "HorizontalPodAutoscaler", "gateway")["spec"]
    assert int(settings["GATEWAY_REDIS__REPLICAS"]) == hpa["maxReplicas"]
    redis_container = redis["spec"]["containers"][0]
    assert "args" not in redis_container  # the password never on a command line
    assert "requirepass" in redis_container["command"][-1]
    assert "$REDISCLI_AUTH" in redis_container["command"][-1]
    # keys required, and the admin port reachable from no pod
    assert settings["GATEWAY_AUTH__KEYS_FILE"] == "/etc/triton-gateway/keys/keys"
    keys = next(v for v in pod["volumes"] if v["name"] == "api-keys")
    assert keys["secret"].get("optional") is not True
    public = by_kind(documents, "NetworkPolicy", "gateway-public-port-only")["spec"]
    assert public["podSelector"]["matchLabels"].items() <= labels.items()
    # the HTTP port and the gRPC door (GATEWAY_GRPC__PORT), never the admin port
    assert [port["port"] for rule in public["ingress"] for port in rule["ports"]] == [8080, 8001]
    assert settings["GATEWAY_GRPC__PORT"] == "8001"

    limits = triton["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    args = triton["spec"]["template"]["spec"]["containers"][0]["args"]
    if overlay == "gpu":
        assert limits["nvidia.com/gpu"] == 1
        assert not any(arg.startswith("--model-config-name") for arg in args)
    else:
        assert "nvidia.com/gpu" not in limits
        assert any(arg.startswith("--model-config-name=cpu") for arg in args)

    # Models are built before Triton starts, in the same pod (same node, same GPU).
    pod = triton["spec"]["template"]["spec"]
    (build,) = pod["initContainers"]
    assert build["name"] == "model-build"
    assert ("--cpu" in build["args"]) == (overlay == "cpu")
    assert build["resources"]["limits"].get("nvidia.com/gpu") == limits.get("nvidia.com/gpu")
    writable = {m["name"] for m in build["volumeMounts"] if not m.get("readOnly")}
    served = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert "models" in writable
    assert served["models"]["readOnly"] is True


@pytest.mark.parametrize("overlay", ["gpu", "cpu"])
def test_service_monitor_is_an_opt_in_component(overlay: str) -> None:
    """Without the Prometheus Operator's CRD, `kubectl apply -k` must not meet a ServiceMonitor."""
    assert not [doc for _, doc in rendered(overlay) if doc["kind"] == "ServiceMonitor"]
    documents = rendered(overlay, ("../components/servicemonitor",))
    monitor = by_kind(documents, "ServiceMonitor", "triton-gateway")["spec"]
    service = by_kind(documents, "Service", "gateway")
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["endpoints"][0]["port"] in [port["name"] for port in service["spec"]["ports"]]
    assert monitor["endpoints"][0]["path"] == "/metrics"
    # Triton scraped on its own, and no longer merged into every gateway replica's /metrics
    triton = by_kind(documents, "ServiceMonitor", "triton")["spec"]
    triton_service = by_kind(documents, "Service", "triton")
    assert triton["selector"]["matchLabels"].items() <= triton_service["metadata"]["labels"].items()
    assert triton["endpoints"][0]["port"] == "metrics"
    assert by_kind(documents, "ConfigMap", "gateway-settings")["data"]["GATEWAY_TRITON__METRICS_URL"] == ""
    plain = by_kind(rendered(overlay), "ConfigMap", "gateway-settings")["data"]
    assert plain["GATEWAY_TRITON__METRICS_URL"] == "http://triton:8002/metrics"
    allowed = by_kind(documents, "NetworkPolicy", "triton-metrics-from-prometheus")["spec"]["ingress"][0]
    assert allowed["ports"] == [{"protocol": "TCP", "port": 8002}]


# --- TensorRT build commands vs the ONNX models -------------------------------------------


def trtexec_plans() -> list[tuple[str, str, str, str, str]]:
    plans = load_script(ROOT / "deploy" / "model-build" / "plans.py", "plans")
    specs = plans.plan_specs(ROOT / "model_repository")
    return [(p.name, ",".join(p.inputs), p.min_shape, p.opt_shape, p.max_shape) for p in specs]


def config_value(model: str, key: str, config: str = "config.pbtxt") -> str:
    text = (ROOT / "model_repository" / model / config).read_text()
    match = re.search(rf"^{key}: (\S+)", text, re.MULTILINE)
    assert match is not None, (model, key)
    return match.group(1).strip('"')


def test_trtexec_shapes_match_the_onnx_models() -> None:
    import onnx

    plans = trtexec_plans()
    assert {"image_model", "text_model"} <= {plan[0] for plan in plans}
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


def _compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return compose


def test_compose_requires_a_grafana_password_and_binds_dashboards_to_loopback() -> None:
    services = _compose()["services"]
    assert ":?" in services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    for name in ("prometheus", "grafana"):
        assert all(
            str(port).startswith("${" + name.upper() + "_BIND:-127.0.0.1}")
            for port in services[name]["ports"]
        )
    for name in ("gateway", "proxy", "prometheus", "grafana"):
        assert services[name]["mem_limit"]
        assert services[name]["pids_limit"]


@pytest.mark.parametrize("missing", ["GRAFANA_ADMIN_PASSWORD", "TRITON_REPOSITORY_KEY", "REDIS_PASSWORD"])
def test_compose_refuses_to_start_without_its_secrets(missing: str, tmp_path: Path) -> None:
    env = {**os.environ, "GRAFANA_ADMIN_PASSWORD": "x", "TRITON_REPOSITORY_KEY": "x", "REDIS_PASSWORD": "x"}
    del env[missing]
    refused = subprocess.run(
        [tool("docker-compose"), "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert refused.returncode != 0
    assert missing in refused.stderr


def _gateway_deployment_and_config() -> tuple[dict[str, Any], dict[str, str]]:
    documents = list(yaml.safe_load_all((ROOT / "deploy/k8s/base/gateway.yaml").read_text()))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    config = yaml.safe_load((ROOT / "deploy/k8s/base/gateway-config.yaml").read_text())["data"]
    return deployment, config


def _mebibytes(quantity: str) -> float:
    units = {"Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


def test_k8s_shutdown_and_memory_are_consistent_with_the_settings() -> None:
    deployment, config = _gateway_deployment_and_config()
    settings = Settings(**_nested(config))
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    grace = settings.server.shutdown_grace_seconds
    assert grace > settings.triton.timeout_seconds
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + grace + 5
    # Admitted requests hold their parsed body: the in-flight cap x the largest body must fit.
    worst = settings.server.max_in_flight * settings.max_json_body_bytes / 2**20
    assert _mebibytes(container["resources"]["limits"]["memory"]) >= worst + 128
    keys = next(v for v in pod["volumes"] if v["name"] == "api-keys")
    assert keys["secret"]["secretName"] == "gateway-api-keys"


def _nested(env: dict[str, str]) -> dict[str, Any]:
    """GATEWAY_A__B=v -> {"a": {"b": "v"}} (what pydantic-settings does with the environment)."""
    found: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith("GATEWAY_"):
            continue
        path = name.removeprefix("GATEWAY_").lower().split("__")
        node = found
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return found


def test_optional_runtime_class_patch_applies_to_the_gpu_triton() -> None:
    triton = by_kind(rendered("gpu"), "Deployment", "triton")
    operations = yaml.safe_load((K8S / "gpu" / "runtime-class-patch.yaml").read_text())
    patched = jsonpatch.apply_patch(triton, operations)
    assert patched["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert "runtime-class-patch.yaml" in (K8S / "gpu" / "kustomization.yaml").read_text()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_ngc_images_keep_nvidias_entrypoint(dockerfile: Path) -> None:
    """It sets up CUDA forward compatibility on older data-center drivers."""
    text = dockerfile.read_text()
    if "nvcr.io/nvidia/" not in text:
        return
    (entrypoint,) = re.findall(r"^ENTRYPOINT (\[.*\])", text, re.MULTILINE)
    assert json.loads(entrypoint)[0] == "/opt/nvidia/nvidia_entrypoint.sh", dockerfile


def test_model_build_installs_into_its_own_environment() -> None:
    text = (ROOT / "deploy" / "model-build" / "Dockerfile").read_text()
    installs = re.findall(r"(\S*pip) install", text)
    assert installs
    assert all(pip == "/opt/model-build/venv/bin/pip" for pip in installs), installs
    assert "MODEL_BUILD_PYTHON=/opt/model-build/venv/bin/python" in text
    assert (
        '"${MODEL_BUILD_PYTHON:-python3}"' in (ROOT / "deploy" / "model-build" / "entrypoint.sh").read_text()
    )


def _trace_flags(args: list[str]) -> dict[str, str]:
    """``--trace-config=[mode,]key=value`` flags as {"[mode,]key": value}."""
    flags = [a.removeprefix("--trace-config=") for a in args if a.startswith("--trace-config=")]
    return dict(flag.rsplit("=", 1) if flag.count("=") == 1 else flag.split("=", 1) for flag in flags)


def test_compose_traces_into_jaeger_from_the_gateway_and_triton() -> None:
    services = compose_config(*GPU)["services"]
    environment = services["gateway"]["environment"]
    assert environment["GATEWAY_TRACING__ENABLED"] == "true"
    endpoint = environment["GATEWAY_TRACING__ENDPOINT"]
    flags = _trace_flags(services["triton"]["command"])
    assert flags["mode"] == "opentelemetry"
    assert flags["opentelemetry,url"] == endpoint  # one collector for both
    assert flags["rate"] == "0"  # Triton traces only what the gateway passes a traceparent to
    assert endpoint.startswith("http://jaeger:4318/")
    assert "backend" in services["jaeger"]["networks"]  # Triton (internal network) reaches it
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    datasources = yaml.safe_load(
        (ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    by_uid = {d["uid"]: d for d in datasources}
    [link] = by_uid["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert link == {"name": "trace_id", "datasourceUid": "jaeger"}  # the exemplar label we write
    assert by_uid["jaeger"]["type"] == "jaeger"


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_k8s_triton_traces_to_the_configmaps_endpoint(overlay: str) -> None:
    documents = rendered(overlay)
    config = by_kind(documents, "ConfigMap", "gateway-settings")["data"]
    assert config["GATEWAY_TRACING__ENABLED"] == "false"  # off until the operator has a collector
    assert 0 < float(config["GATEWAY_TRACING__SAMPLE_RATIO"]) <= 1
    triton = by_kind(documents, "Deployment", "triton")["spec"]["template"]["spec"]["containers"][0]
    flags = _trace_flags(triton["args"])
    assert flags["opentelemetry,url"] == "$(TRACING_ENDPOINT)"
    assert flags["rate"] == "0"
    [env] = [e for e in triton["env"] if e["name"] == "TRACING_ENDPOINT"]
    reference = env["valueFrom"]["configMapKeyRef"]
    assert reference["name"] == "gateway-settings"
    assert reference["key"] in config


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_k8s_triton_takes_model_control_only_with_the_gateways_key(overlay: str) -> None:
    documents = rendered(overlay)
    triton = by_kind(documents, "Deployment", "triton")["spec"]["template"]["spec"]["containers"][0]
    assert "--model-control-mode=explicit" in triton["args"]
    assert "--load-model=*" in triton["args"]
    restricted = "model-repository,shared-memory,trace,logging:triton-gateway-admin-key=$(REPOSITORY_KEY)"
    assert f"--grpc-restricted-protocol={restricted}" in triton["args"]
    assert f"--http-restricted-api={restricted}" in triton["args"]
    gateway = by_kind(documents, "Deployment", "gateway")["spec"]["template"]["spec"]
    [triton_key] = [e for e in triton["env"] if e["name"] == "REPOSITORY_KEY"]
    [gateway_key] = [
        e for e in gateway["containers"][0]["env"] if e["name"] == "GATEWAY_TRITON__REPOSITORY_KEY"
    ]
    assert triton_key["valueFrom"] == gateway_key["valueFrom"]  # one Secret, both sides
    assert triton_key["valueFrom"]["secretKeyRef"]["name"] == "triton-repository-key"
    # the admin port is in no Service, and the admin surface is off in the ConfigMap
    service = by_kind(documents, "Service", "gateway")["spec"]
    assert all(port["port"] != 8081 and port.get("targetPort") != "admin" for port in service["ports"])
    config = by_kind(documents, "ConfigMap", "gateway-settings")["data"]
    assert not any(key.startswith("GATEWAY_ADMIN__") for key in config)


def test_the_redis_command_keeps_its_password_off_the_command_line(tmp_path: Path) -> None:
    """The compose file's redis command, run for real with Debian's redis-server (its
    paths moved into a temporary folder): the password works, and no process's command
    line holds it (before, it was an argument: `ps` showed it to every user)."""
    import signal
    import time

    from gateway.dev.tritonserver import free_port

    services = compose_config(*GPU)["services"]
    script = (
        services["redis"]["command"][-1]
        .replace("$$", "$")
        .replace("/tmp/auth.conf", str(tmp_path / "a.conf"))
    )
    port = free_port()
    script = script.replace("exec redis-server", f"cd {tmp_path} && exec redis-server", 1)
    script += f" --port {port} --bind 127.0.0.1 --save ''"
    password = "a-redis-password"
    server = subprocess.Popen(["sh", "-c", script], env={**os.environ, "REDISCLI_AUTH": password})
    try:
        cli = [tool("redis-cli"), "-p", str(port), "--no-auth-warning"]
        deadline = time.monotonic() + 10
        while True:
            answer = subprocess.run([*cli, "-a", password, "ping"], capture_output=True, text=True)
            if answer.stdout.strip() == "PONG":
                break
            assert time.monotonic() < deadline, answer
            time.sleep(0.1)
        refused = subprocess.run(
            [*cli, "ping"], capture_output=True, text=True, env={"PATH": os.environ["PATH"]}
        )
        assert "NOAUTH" in refused.stdout + refused.stderr
        assert (tmp_path / "a.conf").stat().st_mode & 0o077 == 0
        command_line = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert b"redis-server" in command_line  # the shell replaced itself by the server
        assert password.encode() not in command_line
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)


# --- autoscaling components ---------------------------------------------------------------

REPLICAS = "../components/triton-replicas"
HPA = "../components/autoscale-hpa"
KEDA = "../components/autoscale-keda"
ADAPTER_VALUES = K8S / "components" / "autoscale-hpa" / "prometheus-adapter-values.yaml"


def gateway_metric_names() -> set[str]:
    """Every family the gateway exports, from its own registry (the capacity gauges too)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gateway.app import create_app

    registry = CollectorRegistry()
    create_app(Settings(), registry=registry)
    return {family.name for family in text_string_to_metric_families(generate_latest(registry).decode())}


def adapter_queries() -> dict[str, str]:
    """The adapter's metrics (their custom-metrics names) and PromQL as the adapter runs it
    for one pod of the namespace (its templates filled in)."""
    rules = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    found = {}
    for rule in rules:
        series = rule["seriesQuery"].split("{", 1)[0]
        query = (
            rule["metricsQuery"]
            .replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", 'namespace="triton-gateway",pod="p"')
            .replace("<<.GroupBy>>", "pod")
        )
        found[rule["name"]["as"]] = query
    return found


def promtool_accepts(queries: dict[str, str], tmp_path: Path) -> None:
    rules = {
        "groups": [
            {
                "name": "autoscaling",
                "rules": [{"record": f"check:{n}", "expr": q} for n, q in queries.items()],
            }
        ]
    }
    path = tmp_path / "autoscaling-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("overlay", ["gpu", "cpu"])
def test_the_hpa_component_validates_and_reads_what_the_adapter_serves(overlay: str, tmp_path: Path) -> None:
    documents = rendered(overlay, (REPLICAS, HPA))
    files = []
    for index, (source, document) in enumerate(documents):
        files.append(tmp_path / f"{index:02d}-{source.stem}.yaml")
        files[-1].write_text(yaml.safe_dump(document))
    result = subprocess.run(
        [tool("kubernetes-validate"), "--strict", "--quiet", *map(str, files)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    served = adapter_queries()
    for name in ("gateway", "triton"):
        hpa = by_kind(documents, "HorizontalPodAutoscaler", name)["spec"]
        assert by_kind(documents, "Deployment", hpa["scaleTargetRef"]["name"])
        pods = [m["pods"]["metric"]["name"] for m in hpa["metrics"] if m["type"] == "Pods"]
        assert pods, name
        assert set(pods) <= set(served), (pods, served)
    promtool_accepts(served, tmp_path)
    exported = gateway_metric_names()
    assert "gateway_capacity_in_use" in exported
    for rule in yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]:
        series = rule["seriesQuery"].split("{", 1)[0]
        # the gateway's own, or Triton's as the shipped (promtool-tested) recording rules read them
        recording = (ROOT / "deploy" / "prometheus" / "rules" / "recording.yml").read_text()
        assert series in exported or series in recording, series


@pytest.mark.parametrize("overlay", ["gpu", "cpu"])
def test_the_keda_component_replaces_the_hpa_with_scaled_objects(overlay: str, tmp_path: Path) -> None:
    documents = rendered(overlay, (REPLICAS, KEDA))
    assert not [doc for _, doc in documents if doc["kind"] == "HorizontalPodAutoscaler"]  # KEDA makes its own
    scaled = {doc["metadata"]["name"]: doc["spec"] for _, doc in documents if doc["kind"] == "ScaledObject"}
    assert set(scaled) == {"gateway", "triton"}
    queries = {}
    for name, spec in scaled.items():
        assert by_kind(documents, "Deployment", spec["scaleTargetRef"]["name"])
        assert spec["minReplicaCount"] >= 1
        assert spec["maxReplicaCount"] > spec["minReplicaCount"]
        for index, trigger in enumerate(spec["triggers"]):
            if trigger["type"] == "prometheus":
                assert float(trigger["metadata"]["threshold"]) > 0
                queries[f"{name}_{index}"] = trigger["metadata"]["query"]
    assert "gateway_capacity_in_use" in queries["gateway_0"]
    assert "nv_inference_queue_duration_us" in queries["triton_0"]
    promtool_accepts(queries, tmp_path)
    # everything else passes the strict schema check (KEDA's CRD has no published schema here)
    files = []
    for index, (source, document) in enumerate(documents):
        if document["kind"] != "ScaledObject":
            files.append(tmp_path / f"{index:02d}-{source.stem}.yaml")
            files[-1].write_text(yaml.safe_dump(document))
    result = subprocess.run(
        [tool("kubernetes-validate"), "--strict", "--quiet", *map(str, files)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_several_tritons_share_the_volume_and_the_gateways_spread_over_them() -> None:
    documents = rendered("gpu", (REPLICAS,))
    claim = by_kind(documents, "PersistentVolumeClaim", "triton-models")["spec"]
    assert claim["accessModes"] == ["ReadWriteMany"]
    assert by_kind(documents, "Deployment", "triton")["spec"]["strategy"]["type"] == "RollingUpdate"
    headless = by_kind(documents, "Service", "triton-headless")["spec"]
    assert headless["clusterIP"] == "None"
    config = by_kind(documents, "ConfigMap", "gateway-settings")["data"]
    settings = Settings(
        triton={
            "url": config["GATEWAY_TRITON__URL"],
            "load_balancing": config["GATEWAY_TRITON__LOAD_BALANCING"],
        }
    )
    assert settings.triton.url.startswith("dns:///triton-headless.")
    assert settings.triton.load_balancing == "shortest_queue"
