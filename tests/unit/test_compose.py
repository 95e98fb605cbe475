"""docker-compose.yml, the Dockerfile, .dockerignore and the example configs.

No Docker here: the compose file is checked against the rules of the compose
specification that matter for it (service keys, depends_on conditions,
healthchecks, ports, declared volumes, bind mounts that exist), and the bridge
it starts must accept its config with the environment compose gives it.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.service.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]

# Top-level and service keys of the compose specification.
TOP_LEVEL = {"version", "name", "services", "networks", "volumes", "configs", "secrets", "include"}
SERVICE_KEYS = {
    "annotations",
    "attach",
    "build",
    "blkio_config",
    "cap_add",
    "cap_drop",
    "cgroup",
    "cgroup_parent",
    "command",
    "configs",
    "container_name",
    "cpu_count",
    "cpu_percent",
    "cpu_period",
    "cpu_quota",
    "cpu_rt_period",
    "cpu_rt_runtime",
    "cpu_shares",
    "cpus",
    "cpuset",
    "credential_spec",
    "depends_on",
    "deploy",
    "develop",
    "device_cgroup_rules",
    "devices",
    "dns",
    "dns_opt",
    "dns_search",
    "domainname",
    "entrypoint",
    "env_file",
    "environment",
    "expose",
    "extends",
    "external_links",
    "extra_hosts",
    "gpus",
    "group_add",
    "healthcheck",
    "hostname",
    "image",
    "init",
    "ipc",
    "isolation",
    "labels",
    "links",
    "logging",
    "mac_address",
    "mem_limit",
    "mem_reservation",
    "mem_swappiness",
    "memswap_limit",
    "network_mode",
    "networks",
    "oom_kill_disable",
    "oom_score_adj",
    "pid",
    "pids_limit",
    "platform",
    "ports",
    "privileged",
    "profiles",
    "pull_policy",
    "read_only",
    "restart",
    "runtime",
    "scale",
    "secrets",
    "security_opt",
    "shm_size",
    "stdin_open",
    "stop_grace_period",
    "stop_signal",
    "storage_opt",
    "sysctls",
    "tmpfs",
    "tty",
    "ulimits",
    "user",
    "userns_mode",
    "uts",
    "volumes",
    "volumes_from",
    "working_dir",
}
HEALTHCHECK_KEYS = {
    "test",
    "interval",
    "timeout",
    "retries",
    "start_period",
    "start_interval",
    "disable",
}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
DURATION = re.compile(r"^(\d+(\.\d+)?(us|ms|s|m|h))+$")
PORT = re.compile(
    r"^((\d{1,3}\.){3}\d{1,3}:)?(\d{1,5}(-\d{1,5})?:)?\d{1,5}(-\d{1,5})?(/(tcp|udp))?$"
)
RESTART = {"no", "always", "on-failure", "unless-stopped"}


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    # Resolve ${VAR:-default} as compose does with VAR unset.
    return {k: re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", str(v)) for k, v in env.items()}


def mounts(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    out = []
    for volume in service.get("volumes") or []:
        assert isinstance(volume, str), "short syntax used throughout"
        parts = volume.split(":")
        assert 2 <= len(parts) <= 3, volume
        out.append((parts[0], parts[1], parts[2] if len(parts) == 3 else "rw"))
    return out


# --- the compose specification's rules --------------------------------------------


def test_top_level_keys() -> None:
    assert set(COMPOSE) <= TOP_LEVEL | {k for k in COMPOSE if k.startswith("x-")}
    assert "version" not in COMPOSE, "obsolete in the compose specification"
    assert re.fullmatch(r"[a-z0-9][a-z0-9_-]*", COMPOSE["name"])


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_is_well_formed(name: str) -> None:
    service = SERVICES[name]
    assert re.fullmatch(r"[a-zA-Z0-9._-]+", name)
    unknown = set(service) - SERVICE_KEYS
    assert not unknown, f"{name}: unknown keys {unknown}"
    assert "image" in service or "build" in service
    if "image" in service:
        assert re.fullmatch(r"[a-z0-9./_-]+(:[A-Za-z0-9._-]+)?", service["image"])
        assert not service["image"].endswith(":latest"), "pin image versions"
    for port in service.get("ports") or []:
        assert isinstance(port, str) and PORT.match(port), f"{name}: port {port!r}"
    env = service.get("environment")
    if env is not None:
        assert isinstance(env, dict | list)
        if isinstance(env, dict):
            assert all(isinstance(v, str | int | float | bool) or v is None for v in env.values())
    if "restart" in service:
        assert service["restart"] in RESTART
    for field in ("command", "tmpfs"):
        if field in service:
            assert isinstance(service[field], str | list)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_depends_on_points_at_services_with_valid_conditions(name: str) -> None:
    deps = SERVICES[name].get("depends_on") or {}
    if isinstance(deps, list):
        deps = {d: {"condition": "service_started"} for d in deps}
    for dep, spec in deps.items():
        assert dep in SERVICES and dep != name
        assert spec["condition"] in CONDITIONS
        if spec["condition"] == "service_healthy":
            assert "healthcheck" in SERVICES[dep], f"{name} waits for {dep} to be healthy"


def test_depends_on_has_no_cycle() -> None:
    def deps(name: str) -> set[str]:
        d = SERVICES[name].get("depends_on") or {}
        return set(d)

    visiting: set[str] = set()
    done: set[str] = set()

    def visit(name: str) -> None:
        assert name not in visiting, f"cycle through {name}"
        if name in done:
            return
        visiting.add(name)
        for dep in deps(name):
            visit(dep)
        visiting.discard(name)
        done.add(name)

    for name in SERVICES:
        visit(name)


@pytest.mark.parametrize("name", sorted(n for n in SERVICES if "healthcheck" in SERVICES[n]))
def test_healthchecks_are_well_formed(name: str) -> None:
    check = SERVICES[name]["healthcheck"]
    assert set(check) <= HEALTHCHECK_KEYS
    test = check["test"]
    if isinstance(test, list):
        assert test[0] in ("CMD", "CMD-SHELL", "NONE") and len(test) >= 2
        if test[0] == "CMD-SHELL":
            assert len(test) == 2
    else:
        assert isinstance(test, str)
    for key in ("interval", "timeout", "start_period", "start_interval"):
        if key in check:
            assert DURATION.match(str(check[key])), f"{name}: {key}={check[key]!r}"
    assert isinstance(check.get("retries", 1), int)


def test_named_volumes_are_declared_and_bind_mounts_exist() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    used: set[str] = set()
    for name, service in SERVICES.items():
        for source, target, mode in mounts(service):
            assert target.startswith("/"), f"{name}: {target}"
            assert mode in ("ro", "rw", "z", "Z"), f"{name}: {mode}"
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name}: bind mount {source} missing"
            else:
                assert source in declared, f"{name}: volume {source} not declared"
                used.add(source)
    assert used == declared, f"declared but unused: {declared - used}"


# --- what this compose file must do ------------------------------------------------------


def test_kafka_runs_in_kraft_mode() -> None:
    kafka = SERVICES["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = env_of(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert not any("ZOOKEEPER" in k for k in env)
    listeners = env["KAFKA_LISTENERS"]
    assert "CONTROLLER" in listeners and env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
    node, _, voter = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].partition("@")
    assert node == str(env["KAFKA_NODE_ID"]) and voter == "kafka:9093"
    advertised = env["KAFKA_ADVERTISED_LISTENERS"]
    assert "PLAINTEXT://kafka:9092" in advertised


def test_nats_runs_with_jetstream() -> None:
    nats = SERVICES["nats"]
    command = nats["command"] if isinstance(nats["command"], list) else shlex.split(nats["command"])
    assert "-js" in command or "--jetstream" in command
    assert "4222:4222" in nats["ports"]


def test_k3s_writes_a_kubeconfig_the_bridge_reads() -> None:
    k3s, rewrite, bridge = SERVICES["k3s"], SERVICES["kubeconfig"], SERVICES["bridge"]
    assert k3s["image"].startswith("rancher/k3s:") and k3s["privileged"] is True
    assert "--tls-san=k3s" in k3s["command"], "the certificate must be valid for https://k3s:6443"
    output = env_of(k3s)["K3S_KUBECONFIG_OUTPUT"]
    k3s_mounts = {target: source for source, target, _ in mounts(k3s)}
    volume = k3s_mounts[str(Path(output).parent)]
    assert volume in {source for source, _, _ in mounts(rewrite)}
    assert "https://k3s:6443" in " ".join(rewrite["command"])
    assert rewrite["depends_on"]["k3s"]["condition"] == "service_healthy"
    bridge_mounts = {source: target for source, target, _ in mounts(bridge)}
    settings = bridge_settings()
    assert settings.cluster.kubeconfig is not None
    assert settings.cluster.kubeconfig.startswith(bridge_mounts[volume] + "/")
    assert bridge["depends_on"]["kubeconfig"]["condition"] == "service_completed_successfully"


def bridge_settings() -> Any:
    bridge = SERVICES["bridge"]
    config_mounts = {t: s for s, t, _ in mounts(bridge)}
    command = bridge["command"]
    config_path = command[command.index("--config") + 1]
    return load_settings(str(ROOT / config_mounts[config_path]), env=env_of(bridge))


def test_bridge_config_validates_with_the_compose_environment() -> None:
    settings = bridge_settings()
    assert settings.sink.kind == "nats"
    nats_host, _, nats_port = settings.sink.nats.servers[0].removeprefix("nats://").partition(":")
    assert nats_host == "nats" and nats_port == "4222"
    kafka_host, _, kafka_port = settings.sink.kafka.bootstrap_servers[0].partition(":")
    assert (
        kafka_host == "kafka"
        and f"PLAINTEXT://kafka:{kafka_port}"
        in env_of(SERVICES["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    )
    assert f"{settings.server.port}:{settings.server.port}" in SERVICES["bridge"]["ports"]
    state = {t for _, t, _ in mounts(SERVICES["bridge"])}
    assert str(Path(settings.checkpoint.path).parent) in state, "checkpoint on the state volume"


def test_bridge_switches_to_kafka_by_environment() -> None:
    bridge = SERVICES["bridge"]
    config = {t: s for s, t, _ in mounts(bridge)}["/etc/k8s-bridge/bridge.yaml"]
    env = {**env_of(bridge), "BRIDGE_SINK__KIND": "kafka"}
    assert load_settings(str(ROOT / config), env=env).sink.kind == "kafka"


def test_bridge_is_built_here_and_runs_hardened() -> None:
    bridge = SERVICES["bridge"]
    assert bridge["build"]["context"] == "." and (ROOT / bridge["build"]["dockerfile"]).exists()
    assert bridge["user"] == "10001:10001" and bridge["read_only"] is True
    assert "/tmp" in bridge["tmpfs"]
    assert {d for d, s in bridge["depends_on"].items()} == {"kubeconfig", "nats", "kafka"}


# --- Dockerfile and .dockerignore -----------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_runs_the_cli_as_non_root() -> None:
    steps = dockerfile()
    froms = [rest for word, rest in steps if word == "FROM"]
    assert froms and all(f.split()[0] == "python:3.11-slim" for f in froms)
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    words = dict(final)
    assert words["USER"] == "10001:10001"
    assert json.loads(words["ENTRYPOINT"]) == ["k8s-bridge"]
    assert json.loads(words["CMD"]) == ["run", "--config", "/etc/k8s-bridge/bridge.yaml"]
    runs = [r for w, r in final if w == "RUN"]
    assert any("useradd" in r and "--uid 10001" in r for r in runs)
    assert any("pip install" in r and "k8s-bridge" in r for r in runs)


def ignored(path: str, patterns: list[str]) -> bool:
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        pattern = pattern.removeprefix("**/")
        parts = Path(path).parts
        hit = any(
            fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) or fnmatch.fnmatch(parts[i], pattern)
            for i in range(len(parts))
        )
        if hit:
            result = not negate
    return result


def test_dockerignore_keeps_what_the_build_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied: list[str] = []
    for word, rest in dockerfile():
        if word == "COPY" and "--from" not in rest:
            copied.extend(rest.split()[:-1])
    assert copied
    for source in copied:
        assert (ROOT / source).exists(), f"COPY {source}: missing"
        assert not ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"
    for junk in (".venv", ".git", "tests/unit", "bridge/__pycache__", "state.db"):
        assert ignored(junk, patterns), f"{junk} should not reach the build context"


@pytest.mark.parametrize("path", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_every_example_config_is_valid(path: str) -> None:
    settings = load_settings(str(ROOT / "examples" / path), env={})
    assert settings.resources
