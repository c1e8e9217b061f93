"""The deployment files agree with each other and with the package.

Docker cannot run here, so the compose file, the Dockerfile and the systemd units are checked
as text: every path they name exists, and the names, ports and numbers that must match across
files (Prometheus' target, Grafana's datasource, Ollama's parallelism) do.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.__main__ import main
from gateway.app import create_app
from gateway.config.policy import load_policy
from gateway.config.settings import Settings

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
COMPOSE_POLICY = DEPLOY / "fairgate.compose.yaml"
PROMETHEUS_PORT = 9090  # Prometheus' default --web.listen-address


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return document


def service(name: str) -> dict[str, Any]:
    services: dict[str, dict[str, Any]] = compose()["services"]
    return services[name]


def bind_mounts(name: str) -> dict[str, Path]:
    """A service's bind mounts (host paths relative to the repository), by container path."""
    mounts = {}
    for volume in service(name).get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (REPO / source).resolve()
    return mounts


def environment(name: str) -> dict[str, str]:
    given = service(name).get("environment", {})
    if isinstance(given, list):
        given = dict(item.split("=", 1) for item in given)
    return {key: str(value) for key, value in given.items()}


def published_container_ports(name: str) -> set[int]:
    return {int(str(port).rpartition(":")[2].split("/")[0]) for port in service(name)["ports"]}


def dockerfile() -> list[tuple[str, str]]:
    """The final stage's instructions as (KEYWORD, arguments), continuation lines joined."""
    lines, pending = [], ""
    for raw in (REPO / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    instructions = [tuple(line.split(None, 1)) for line in lines]
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword.upper() == "FROM")
    return [(keyword.upper(), args) for keyword, args in instructions[last_from:]]


def dockerfile_env() -> dict[str, str]:
    env = {}
    for keyword, args in dockerfile():
        if keyword == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(args))
    return env


def unit_settings(path: Path) -> dict[str, list[str]]:
    """A systemd unit's Key=value lines; keys may repeat (Environment=)."""
    settings: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def unit_environment(path: Path) -> dict[str, str]:
    pairs = [shlex.split(value)[0] for value in unit_settings(path).get("Environment", [])]
    return dict(pair.split("=", 1) for pair in pairs)


def ollama_backend(policy_file: Path, host: str) -> dict[str, Any]:
    backends = yaml.safe_load(policy_file.read_text())["backends"]
    matching = [
        b
        for b in backends
        if b.get("kind", "ollama") == "ollama" and urlsplit(b["url"]).netloc == host
    ]
    assert len(matching) == 1, f"one ollama backend at {host} in {policy_file.name}"
    backend: dict[str, Any] = matching[0]
    return backend


def test_compose_references_only_files_that_exist() -> None:
    """Every build context, Dockerfile and bind-mounted path in the compose file exists."""
    for name, spec in compose()["services"].items():
        if "build" in spec:
            build = spec["build"]
            context = REPO / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile_name = "Dockerfile" if isinstance(build, str) else build.get("dockerfile")
            assert (context / (dockerfile_name or "Dockerfile")).is_file(), name
        for target, source in bind_mounts(name).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) is missing"


def test_the_gateway_service_mounts_the_compose_policy_where_the_image_looks_for_it() -> None:
    """The policy is mounted read-only at the image's FAIRGATE_CONFIG."""
    config = environment("fairgate").get("FAIRGATE_CONFIG", dockerfile_env()["FAIRGATE_CONFIG"])
    assert bind_mounts("fairgate")[config] == COMPOSE_POLICY
    mount = next(v for v in service("fairgate")["volumes"] if f":{config}" in v)
    assert mount.endswith(":ro")


def test_prometheus_scrapes_the_gateway_service_on_the_port_it_listens_on() -> None:
    """Prometheus' target fairgate:8080 names the compose service and its listening port."""
    mounts = bind_mounts("prometheus")
    config_dir = mounts["/etc/prometheus"]
    config = yaml.safe_load((config_dir / "prometheus.yml").read_text())
    assert "--config.file=/etc/prometheus/prometheus.yml" in service("prometheus")["command"]
    for rule_file in config.get("rule_files", []):
        assert (config_dir / rule_file).is_file(), rule_file
    targets = [
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    ]
    assert targets == ["fairgate:8080"]
    host, _, port = targets[0].partition(":")
    assert host in compose()["services"]
    listen = environment(host).get("FAIRGATE_LISTEN", dockerfile_env()["FAIRGATE_LISTEN"])
    assert listen.rpartition(":")[2] == port
    assert int(port) in published_container_ports(host)


def test_grafana_reaches_prometheus_by_service_name_and_finds_the_mounted_dashboards() -> None:
    """The datasource URL is http://prometheus:9090 and the dashboards path is a mount."""
    mounts = bind_mounts("grafana")
    provisioning = mounts["/etc/grafana/provisioning"]
    assert provisioning == DEPLOY / "grafana" / "provisioning"
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    url = urlsplit(datasources["datasources"][0]["url"])
    assert url.hostname in compose()["services"]
    assert url.hostname == "prometheus"
    assert url.port == PROMETHEUS_PORT
    assert not any("web.listen-address" in arg for arg in service("prometheus")["command"])

    providers = yaml.safe_load((provisioning / "dashboards" / "fairgate.yml").read_text())
    path = providers["providers"][0]["options"]["path"]
    assert mounts[path] == DEPLOY / "grafana" / "dashboards"
    dashboards = list(mounts[path].glob("*.json"))
    assert dashboards
    for dashboard in dashboards:
        json.loads(dashboard.read_text())


def test_only_the_gateway_and_grafana_are_published_and_ollama_is_not() -> None:
    """Ollama has no published port; the gateway (8080) and Grafana (3000) are the only ones."""
    services = compose()["services"]
    assert "ports" not in services["ollama"]
    published = {name for name, spec in services.items() if spec.get("ports")}
    assert published == {"fairgate", "grafana"}
    assert published_container_ports("fairgate") == {8080}
    assert published_container_ports("grafana") == {3000}


def test_compose_ollama_parallelism_equals_the_slots_of_its_backend() -> None:
    """OLLAMA_NUM_PARALLEL of the ollama service equals slots of http://ollama:11434."""
    backend = ollama_backend(COMPOSE_POLICY, "ollama:11434")
    assert int(environment("ollama")["OLLAMA_NUM_PARALLEL"]) == backend["slots"]


def test_every_service_restarts_and_keeps_its_data_in_named_volumes() -> None:
    """Each service has a restart policy; models, Prometheus and Grafana data are volumes."""
    document = compose()
    for name, spec in document["services"].items():
        assert spec.get("restart") in {"always", "unless-stopped", "on-failure"}, name
    named = {
        volume.split(":")[0]
        for spec in document["services"].values()
        for volume in spec.get("volumes", [])
        if not volume.startswith((".", "/"))
    }
    assert named == set(document["volumes"]) >= {"models", "prometheus-data", "grafana-data"}


def test_compose_redis_keeps_usage_on_a_volume() -> None:
    """The gateway keeps usage in Redis there, so Redis writes its append-only file to a
    named volume."""
    redis = service("redis")
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert "FAIRGATE_REDIS_URL" in environment("fairgate")
    assert any(volume.endswith(":/data") for volume in redis["volumes"])


def test_the_image_and_the_unit_keep_usage_where_the_gateway_may_write() -> None:
    """FAIRGATE_USAGE_DB is in a directory the image's user owns, and in the unit's
    StateDirectory (the rest of the system is read-only to it)."""
    database = Path(dockerfile_env()["FAIRGATE_USAGE_DB"])
    user = dict(dockerfile())["USER"]
    made = [args for keyword, args in dockerfile() if keyword == "RUN" and "install -d" in args]
    assert any(f"-o {user}" in args and str(database.parent) in args for args in made)
    unit = unit_settings(DEPLOY / "systemd" / "fairgate.service")
    state = Path("/var/lib") / unit["StateDirectory"][0]
    assert (
        Path(unit_environment(DEPLOY / "systemd" / "fairgate.service")["FAIRGATE_USAGE_DB"]).parent
        == state
    )


@pytest.mark.parametrize("path", sorted(DEPLOY.glob("*.yaml")), ids=lambda path: path.name)
def test_every_example_policy_passes_check_config(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fairgate check-config` accepts each policy file shipped in deploy/."""
    assert main(["check-config", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ok (")


def test_the_images_entrypoint_is_the_console_script_and_it_serves() -> None:
    """ENTRYPOINT is pyproject's [project.scripts] fairgate and CMD is serve."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    instructions = dict(dockerfile())
    entrypoint = json.loads(instructions["ENTRYPOINT"])
    assert entrypoint == ["fairgate"]
    assert scripts[entrypoint[0]] == "gateway.__main__:main"
    assert json.loads(instructions["CMD"]) == ["serve"]
    assert instructions["USER"] not in {"root", "0"}
    assert "HEALTHCHECK" in instructions
    env = dockerfile_env()
    assert env["FAIRGATE_LISTEN"] == "0.0.0.0:8080"
    assert env["FAIRGATE_CONFIG"] == "/etc/fairgate/fairgate.yaml"
    assert env["FAIRGATE_LOG_FORMAT"] == "json"


def test_the_image_installs_without_dev_extras() -> None:
    """The final stage installs the built wheel, without the [dev] extra or an editable mode."""
    installs = [
        args for keyword, args in dockerfile() if keyword == "RUN" and "pip install" in args
    ]
    assert installs
    for command in installs:
        assert "[dev]" not in command
        assert " -e " not in command and "--editable" not in command
        assert ".whl" in command


def test_the_systemd_unit_serves_after_ollama_and_reloads_with_hup() -> None:
    """ExecReload sends SIGHUP to the main process and ExecStart runs `fairgate serve`."""
    unit = unit_settings(DEPLOY / "systemd" / "fairgate.service")
    reload_command = shlex.split(unit["ExecReload"][0])
    assert reload_command[0].endswith("kill")
    assert "-HUP" in reload_command or ("-s" in reload_command and "HUP" in reload_command)
    assert reload_command[-1] == "$MAINPID"
    start = shlex.split(unit["ExecStart"][0])
    assert Path(start[0]).name == "fairgate"
    assert start[1:] == ["serve"]
    assert "ollama.service" in " ".join(unit["After"]).split()
    for hardening in ("ProtectSystem", "NoNewPrivileges", "PrivateTmp"):
        assert unit[hardening][0] in {"strict", "yes", "true"}, hardening


def test_the_ollama_drop_in_matches_the_example_policys_backend() -> None:
    """The override's OLLAMA_HOST and OLLAMA_NUM_PARALLEL match fairgate.example.yaml."""
    env = unit_environment(DEPLOY / "systemd" / "ollama-override.conf")
    assert env["OLLAMA_HOST"] == "127.0.0.1:11434"
    backend = ollama_backend(DEPLOY / "fairgate.example.yaml", env["OLLAMA_HOST"])
    assert int(env["OLLAMA_NUM_PARALLEL"]) == backend["slots"]


def test_the_systemd_units_header_installs_only_files_that_exist() -> None:
    """Each `install ... SOURCE TARGET` in the unit's notes copies a file of the checkout."""
    unit = DEPLOY / "systemd" / "fairgate.service"
    commands = [
        line.lstrip("#").split("&&")[0].split()
        for line in unit.read_text().splitlines()
        if line.startswith("#")
    ]
    sources = [words[-2] for words in commands if words[1:2] == ["install"]]
    assert sources, "the header installs nothing"
    for source in sources:
        assert (REPO / source).is_file(), f"{unit.name} installs {source}, which does not exist"


def test_the_compose_health_check_asks_the_gateway_whether_it_is_ready() -> None:
    """The gateway service's health check fetches /readyz, a route the gateway serves,
    on the port it listens on."""
    check = " ".join(service("fairgate")["healthcheck"]["test"])
    found = re.search(r"http://[^'\"\s]+", check)
    assert found, check
    url = urlsplit(found.group(0))
    listen = environment("fairgate").get("FAIRGATE_LISTEN", dockerfile_env()["FAIRGATE_LISTEN"])
    assert (url.path, url.port) == ("/readyz", int(listen.rpartition(":")[2]))
    app = create_app(Settings(), load_policy(COMPOSE_POLICY))
    routes = {
        (route.method, route.resource.canonical) for route in app.router.routes() if route.resource
    }
    assert ("GET", "/readyz") in routes


def test_the_systemd_unit_waits_for_ready_gives_the_drain_time_and_descriptors() -> None:
    """Type=notify (the gateway says READY=1), a stop timeout longer than the drain, and a
    descriptor limit above the default connection cap plus the backend pool."""
    unit = unit_settings(DEPLOY / "systemd" / "fairgate.service")
    defaults = Settings.model_fields
    assert unit["Type"] == ["notify"]
    assert float(unit["TimeoutStopSec"][0]) > defaults["drain_timeout"].default
    needed = defaults["max_connections"].default + defaults["upstream_pool_size"].default
    assert int(unit["LimitNOFILE"][0]) > needed


def test_compose_gives_the_gateway_descriptors_and_the_drain_time() -> None:
    """The compose service raises the descriptor limit and waits out the drain on stop."""
    service = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["fairgate"]
    defaults = Settings.model_fields
    needed = defaults["max_connections"].default + defaults["upstream_pool_size"].default
    assert service["ulimits"]["nofile"]["soft"] > needed
    assert float(service["stop_grace_period"].removesuffix("s")) > defaults["drain_timeout"].default
