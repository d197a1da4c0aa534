"""docker-compose.yml is a valid Compose file, and the stack it describes holds together.

The file is validated against the Compose Specification's JSON schema as compose-go (what
``docker compose`` uses) embeds it: tests/support/schemas/compose-spec.json (provenance in the
README beside it). No Docker engine exists here; tests/e2e/test_compose_env.py runs the
services with the file's environment.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from support.compose_stack import interpolate
from support.dockerfile import parse

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = ROOT / "tests" / "support" / "schemas" / "compose-spec.json"
OURS = {
    "ingest": "ingest",
    "decision": "decision",
    "actuator": "actuator",
    "dcgm-exporter-simulator": "ingest",  # the ingest image with the simulator's command
}


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text())
    checker = jsonschema.FormatChecker()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=checker)  # type: ignore[no-any-return]


def errors(document: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in validator().iter_errors(document)
    ]


def test_the_compose_file_validates_against_the_compose_specification() -> None:
    assert errors(compose()) == []


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda d: d["services"]["ingest"].update(restart_policy="always"), "restart_policy"),
        (lambda d: d["services"]["nats"].update(ports=4222), "not of type 'array'"),
        (lambda d: d["services"]["ingest"].update(depends_on={"nats": {"condition": "up"}}), "up"),
        (lambda d: d["services"].update({"bad name!": {"image": "x"}}), "bad name!"),
    ],
    ids=["unknown-key", "bad-type", "bad-condition", "bad-name"],
)
def test_the_schema_catches_mistakes(change: Any, complaint: str) -> None:
    """The validation is not vacuous: each of these broken files is refused."""
    document = compose()
    change(document)
    found = errors(document)
    assert any(complaint in e for e in found), found


def test_the_vendored_schema_is_the_one_its_readme_names() -> None:
    import hashlib

    readme = (SCHEMA.parent / "README.md").read_text()
    digest = hashlib.sha256(SCHEMA.read_bytes()).hexdigest()
    assert digest in readme


@pytest.mark.parametrize("service", sorted(OURS))
def test_our_containers_are_non_root_read_only_with_a_tmpfs(service: str) -> None:
    spec = compose()["services"][service]
    assert spec["user"] == "10001:10001"
    assert spec["read_only"] is True
    assert "/tmp" in spec["tmpfs"]
    image = OURS[service]
    assert spec["image"].startswith(f"ghcr.io/fracpilot/fracpilot-{image}:")
    assert spec["build"] == {"context": ".", "dockerfile": f"deploy/docker/{image}.Dockerfile"}
    assert (ROOT / spec["build"]["dockerfile"]).is_file()
    env = spec["environment"]
    assert env["FRACPILOT_METRICS_HOST"] == "0.0.0.0"
    assert env["FRACPILOT_METRICS_PORT"] == "9090"


def healthchecked(services: dict[str, Any], name: str) -> bool:
    """A healthcheck in the compose file, or in the Dockerfile of the image it builds."""
    spec = services[name]
    if "healthcheck" in spec and not spec["healthcheck"].get("disable"):
        return True
    build = spec.get("build")
    if build is None:
        return False
    return parse(ROOT / build["dockerfile"]).final.last("HEALTHCHECK") is not None


def test_services_wait_for_healthy_dependencies() -> None:
    services = compose()["services"]
    for name, spec in services.items():
        for dependency, condition in (spec.get("depends_on") or {}).items():
            assert condition == {"condition": "service_healthy"}, (name, dependency)
            assert healthchecked(services, dependency), f"{dependency} has no healthcheck"
    assert set(services["ingest"]["depends_on"]) == {"nats", "prometheus"}
    for name in ("decision", "actuator", "dcgm-exporter-simulator"):
        assert set(services[name]["depends_on"]) == {"nats"}


def test_every_service_has_a_healthcheck_or_is_optional() -> None:
    services = compose()["services"]
    for name, spec in services.items():
        if "observability" in spec.get("profiles", []):
            continue  # Grafana and the collector: nothing waits for them
        assert healthchecked(services, name), name


def test_nats_runs_jetstream_and_its_healthcheck_asks_the_monitoring_port() -> None:
    nats = compose()["services"]["nats"]
    command = nats["command"]
    assert "--jetstream" in command
    port = command[command.index("--http_port") + 1]
    assert any(f"127.0.0.1:{port}/healthz" in part for part in nats["healthcheck"]["test"])


def test_mounted_files_exist() -> None:
    for name, spec in compose()["services"].items():
        for volume in spec.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: {source}"


def test_optional_parts_are_in_the_observability_and_cluster_profiles() -> None:
    services = compose()["services"]
    optional = {n for n, s in services.items() if "profiles" in s}
    assert optional == {"grafana", "otel-collector", "nats-1", "nats-2", "nats-3"}
    assert all(services[n]["profiles"] == ["observability"] for n in ("grafana", "otel-collector"))
    assert all(services[f"nats-{i}"]["profiles"] == ["cluster"] for i in (1, 2, 3))


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_cluster_profile_routes_three_jetstream_servers_to_one_another() -> None:
    services = compose()["services"]
    nodes = [services[f"nats-{i}"] for i in (1, 2, 3)]
    routes = {option(n["command"], "--routes") for n in nodes}
    assert routes == {"nats://nats-1:6222,nats://nats-2:6222,nats://nats-3:6222"}
    assert [option(n["command"], "--server_name") for n in nodes] == ["nats-1", "nats-2", "nats-3"]
    assert {option(n["command"], "--cluster_name") for n in nodes} == {"fracpilot"}
    assert {option(n["command"], "--cluster") for n in nodes} == {"nats://0.0.0.0:6222"}
    assert len({n["volumes"][0] for n in nodes}) == 3  # a store each
    for node in nodes:
        assert "--jetstream" in node["command"]
        port = option(node["command"], "--http_port")
        assert f"http://127.0.0.1:{port}/healthz" in node["healthcheck"]["test"]
        assert "ports" not in node  # 4222 on the host stays the single server's


def test_the_services_take_the_cluster_urls_from_fracpilot_nats_url() -> None:
    services = compose()["services"]
    cluster = "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222"
    assert cluster in COMPOSE.read_text()  # the command the header gives
    for name in ("ingest", "decision", "actuator", "dcgm-exporter-simulator"):
        url = services[name]["environment"]["FRACPILOT_NATS_URL"]
        assert interpolate(url) == "nats://nats:4222"
        assert interpolate(url, {"FRACPILOT_NATS_URL": cluster}) == cluster


def test_prometheus_scrapes_the_simulator_and_the_three_services() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    services = compose()["services"]
    targets = {
        job["job_name"]: {t for static in job["static_configs"] for t in static["targets"]}
        for job in config["scrape_configs"]
    }
    exporter_port = services["dcgm-exporter-simulator"]["environment"]["FRACPILOT_EXPORTER_PORT"]
    assert targets["dcgm-exporter"] == {f"dcgm-exporter-simulator:{exporter_port}"}
    assert targets["fracpilot"] >= {"ingest:9090", "decision:9090", "actuator:9090"}
    matchers = services["ingest"]["environment"]["FRACPILOT_PROMETHEUS_MATCHERS"]
    assert matchers == 'job="dcgm-exporter"'


def test_promtool_accepts_the_prometheus_config() -> None:
    from support.prometheus_server import find_prometheus

    promtool = shutil.which("promtool") or str(Path(find_prometheus()).parent / "promtool")
    result = subprocess.run(
        [promtool, "check", "config", str(ROOT / "deploy" / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_collector_pipelines_use_only_declared_components() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "otel" / "collector.yaml").read_text())
    service = config["service"]
    for pipeline in service["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"{kind}: {component}"
    assert set(service.get("extensions", [])) <= set(config.get("extensions", {}))
    endpoint = config["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert endpoint.endswith(":4318")


def test_the_unauthenticated_nats_is_published_on_loopback_only_and_says_so() -> None:
    """Compose's NATS runs without auth or TLS to stay a one-command demo (issue 29): only the
    host's loopback reaches a published NATS port, and the file says so."""
    services = compose()["services"]
    servers = {n: s for n, s in services.items() if s.get("image", "").startswith("nats:")}
    assert set(servers) == {"nats", "nats-1", "nats-2", "nats-3"}
    published = {n: [str(p) for p in s.get("ports", [])] for n, s in servers.items()}
    assert published["nats"] == ["127.0.0.1:4222:4222"]
    assert all(p.startswith("127.0.0.1:") for ports in published.values() for p in ports)
    assert "NATS here has no authentication and no TLS" in COMPOSE.read_text()
