"""deploy/: the compose file, the instance config, the image and its entrypoint, checked statically
and in pieces, in seconds. rocm_assets_tests/test_deploy_real.py builds and runs the whole of it.

Real here:
- Compose v2 (the docker CLI's plugin, or Debian 13's docker-compose 2.26 that .ci/setup unpacks)
  validates deploy/docker-compose.yaml with deploy/env.example (`config`: the compose schema and
  interpolation), and the resolved file is checked against deploy/dagster.yaml: the volumes, the
  network and the environment a run worker gets must exist on the compose side.
- Dagster's own instance schema validates deploy/dagster.yaml, and the coordinator, the
  DockerRunLauncher and the compute log manager are rebuilt from it (ConfigurableClassData) with
  the env vars it names set; the coordinator then loads the real bake file and fleet through them.
- The `dockerd` fixture's engine (Debian's Docker 20.10 with BuildKit, no network) builds the
  Dockerfile's `sources` stage, which downloads nothing, and the test reads the files it holds.
- The same engine parses the whole Dockerfile and stops exactly at its first download: the base
  images are pointed (build args) at the real docker-registry on loopback, which lacks them, so
  the failure is a deterministic "not found" with or without network. A Dockerfile with a bad
  instruction fails before any image is looked up, so reaching the lookup means every instruction
  of every stage parsed.
- The entrypoint writes registry auth that the real docker client and engine use to push to the
  real docker-registry behind htpasswd; without it the same push is refused. It waits for a
  PostgreSQL that does not answer, saying so, and refuses a login the real server refuses.
- hadolint and shellcheck on deploy/'s Dockerfiles (their RUN scripts too) and shell scripts.
"""

import base64
import configparser
import io
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from dagster._config import process_config
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.instance.config import dagster_instance_config
from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager
from dagster._serdes import ConfigurableClassData
from dagster_docker import DockerRunLauncher
from dagster_postgres.utils import pg_url_from_config

from rocm_assets.core.common import constants
from rocm_assets.instance.coordinator import PlacementRunCoordinator
from rocm_assets.instance.postgres import PostgresStorage
from rocm_assets_tests.helpers import PROJECT_ROOT
from rocm_assets_tests.servers.dockerd import Dockerd
from rocm_assets_tests.servers.registry import RegistryServer

DEPLOY_DIR = PROJECT_ROOT / "deploy"
COMPOSE_FILE = DEPLOY_DIR / "docker-compose.yaml"
ENV_EXAMPLE = DEPLOY_DIR / "env.example"
DOCKERFILE = DEPLOY_DIR / "Dockerfile"
ENTRYPOINT = DEPLOY_DIR / "entrypoint.py"
FARM_SERVICES = ("code-location", "webserver", "daemon", "docker")
REQUIREMENTS = DEPLOY_DIR / "requirements.txt"
# Debian 13's docker-compose (v2), unpacked by .ci/setup where the machine's own is 1.29.
COMPOSE_V2 = Path(os.environ.get("ROCM_TEST_COMPOSE", "/opt/rocm-assets/compose-2/docker-compose"))
SYSTEMD_DIR = DEPLOY_DIR / "systemd"
DAEMON_UNIT = "rocm-assets-daemon.service"
CODE_SERVER_UNIT = "rocm-assets-code-server.service"
# Where the units expect the project's virtualenv.
_UNIT_VENV_BIN = "/opt/rocm-assets/venv/bin/"
DOCKER_SOCKET = "/var/run/docker.sock"
_TIMEOUT_S = 300
# BUILDKIT_BUILD_NAME, which names the history records the builds are found by.
_MIN_BUILDX = (0, 27)


def _run(argv: list[str], env: Mapping[str, str], **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
        **kwargs,
    )


# ---- docker-compose.yaml ----


def _compose_argv() -> list[str]:
    """Compose v2 (the file uses `additional_contexts`, which 1.29 rejects): the docker CLI's
    plugin, else Debian 13's unpacked by .ci/setup; fail saying how to get one."""
    docker = shutil.which("docker")
    if docker is not None:
        version = _run([docker, "compose", "version", "--short"], os.environ)
        if version.returncode == 0 and version.stdout.strip().lstrip("v").startswith("2."):
            return [docker, "compose"]
    if os.access(COMPOSE_V2, os.X_OK):
        return [str(COMPOSE_V2)]
    pytest.fail(
        f"no Compose v2: neither `docker compose` nor {COMPOSE_V2} (.ci/setup unpacks Debian 13's "
        "docker-compose there; on Debian 13, apt-get install docker-compose)",
        pytrace=False,
    )


def _compose_config(env_file: Path) -> subprocess.CompletedProcess:
    # A clean environment: only the env file decides, as `.env` does on a Docker host.
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    # The tools profile too, so the `docker` service is resolved and checked with the rest.
    argv = [*_compose_argv(), "--env-file", str(env_file), "-f", str(COMPOSE_FILE)]
    argv += ["--profile", "tools", "config"]
    return _run(argv, env)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The compose file as docker-compose resolves it with deploy/env.example."""
    result = _compose_config(ENV_EXAMPLE)
    assert result.returncode == 0, (
        f"docker-compose config rejected {COMPOSE_FILE}:\n{result.stderr}"
    )
    return yaml.safe_load(result.stdout)


def _load_deploy_yaml() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY_DIR / "dagster.yaml").read_text())


def _mounts(service: Mapping[str, Any]) -> dict[str, str]:
    """target -> source of a resolved service's volumes, short or long syntax."""
    mounts: dict[str, str] = {}
    for entry in service.get("volumes", []):
        if isinstance(entry, str):
            source, target = entry.split(":")[:2]
        else:
            source, target = entry["source"], entry["target"]
        mounts[target] = source
    return mounts


@pytest.mark.real
def test_compose_file_validates_with_the_example_env(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", *FARM_SERVICES}
    images = {compose["services"][name]["image"] for name in FARM_SERVICES}
    code_location = compose["services"]["code-location"]
    # Run workers are launched from the image the code location reports.
    assert images == {code_location["environment"]["DAGSTER_CURRENT_IMAGE"]}
    for name in FARM_SERVICES:
        build = compose["services"][name]["build"]
        assert Path(build["context"]).resolve() == PROJECT_ROOT
        assert (Path(build["context"]) / build["dockerfile"]).resolve() == DOCKERFILE


@pytest.mark.real
def test_compose_refuses_a_missing_required_setting(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    lines = ENV_EXAMPLE.read_text().splitlines()
    env_file.write_text(
        "\n".join(line for line in lines if not line.startswith("DAGSTER_POSTGRES_PASSWORD="))
    )
    result = _compose_config(env_file)
    assert result.returncode != 0
    assert "set DAGSTER_POSTGRES_PASSWORD in deploy/.env" in result.stderr


@pytest.mark.real
def test_run_workers_get_what_the_compose_side_defines(compose: dict[str, Any]) -> None:
    launcher = _load_deploy_yaml()["run_launcher"]["config"]
    assert launcher["network"] in {n["name"] for n in compose["networks"].values()}
    volume_names = {key: volume["name"] for key, volume in compose["volumes"].items()}
    # Each run worker volume is a compose volume by its fixed name, mounted at the same path there.
    compose_mounts = {
        (volume_names.get(source, source), target)
        for service in compose["services"].values()
        for target, source in _mounts(service).items()
    }
    for spec in launcher["container_kwargs"]["volumes"]:
        name, target = spec.split(":")[:2]
        assert name in volume_names.values(), f"{name} is not a named volume in {COMPOSE_FILE.name}"
        assert (name, target) in compose_mounts, f"no compose service mounts {name} at {target}"
    # The daemon hands its own values on: it must have every one the run worker is given.
    daemon_env = compose["services"]["daemon"]["environment"]
    missing = [name for name in launcher["env_vars"] if name not in daemon_env]
    assert not missing, f"the daemon's environment lacks {missing}"


@pytest.mark.real
def test_every_farm_setting_reaches_the_code_and_the_runs(compose: dict[str, Any]) -> None:
    settings = {
        value
        for name, value in vars(constants).items()
        if name.endswith("_ENV") and isinstance(value, str) and value.startswith("ROCM_")
    }
    # The code location runs the definitions and the sensors: it gets every setting there is.
    code_location_env = compose["services"]["code-location"]["environment"]
    assert settings <= set(code_location_env), f"unset there: {settings - set(code_location_env)}"
    # A run bakes, pushes, probes and runs checks over SSH.
    run_reads = {
        constants.BAKE_FILE_ENV,
        constants.FLEET_FILE_ENV,
        constants.REGISTRY_URL_ENV,
        constants.REGISTRY_USERNAME_ENV,
        constants.REGISTRY_PASSWORD_ENV,
        constants.REGISTRY_CA_ENV,
        constants.SSH_KNOWN_HOSTS_ENV,
        constants.REGISTRY_VAR,
    }
    env_vars = set(_load_deploy_yaml()["run_launcher"]["config"]["env_vars"])
    assert run_reads <= env_vars, f"not passed to run workers: {run_reads - env_vars}"


@pytest.mark.real
def test_docker_socket_only_where_runs_are_launched_or_stopped(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("webserver", "daemon"):
        assert _mounts(services[name]).get(DOCKER_SOCKET) == DOCKER_SOCKET
        assert services[name]["group_add"], f"{name} needs the socket's group"
    for name in ("code-location", "docker"):
        assert DOCKER_SOCKET not in _mounts(services[name])
    worker_volumes = _load_deploy_yaml()["run_launcher"]["config"]["container_kwargs"]["volumes"]
    assert not [v for v in worker_volumes if DOCKER_SOCKET in v]


@pytest.mark.real
def test_bake_and_fleet_files_lie_on_their_mounts(compose: dict[str, Any]) -> None:
    for name in FARM_SERVICES:
        service = compose["services"][name]
        targets = _mounts(service)
        for setting, volume in (
            (constants.BAKE_FILE_ENV, "rocm-farm-bake"),
            (constants.FLEET_FILE_ENV, "rocm-farm-etc"),
        ):
            mounted_at = [t for t, source in targets.items() if source == volume]
            if not mounted_at:
                continue
            path = Path(service["environment"][setting])
            assert any(path.is_relative_to(t) for t in mounted_at), f"{name}: {setting}={path}"


@pytest.mark.real
def test_the_farm_services_come_back_when_they_die(compose: dict[str, Any]) -> None:
    # `kill -9` of the daemon included: Docker restarts what exits unless someone stopped it.
    for name in ("postgres", "code-location", "webserver", "daemon"):
        assert compose["services"][name]["restart"] == "unless-stopped", name


# ---- systemd/ ----


def _unit(name: str) -> dict[str, dict[str, str]]:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string((SYSTEMD_DIR / name).read_text())
    return {section: dict(parser[section]) for section in parser.sections()}


@pytest.mark.real
def test_systemd_units_verify_and_restart_the_daemon_apart_from_its_builds(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    daemon, server = _unit(DAEMON_UNIT), _unit(CODE_SERVER_UNIT)
    assert daemon["Service"]["Restart"] == server["Service"]["Restart"] == "always"
    # The daemon runs what compose runs, over a workspace that points at the code server's
    # address: run workers are the code server's, so a daemon restart stops no build.
    exec_daemon = shlex.split(daemon["Service"]["ExecStart"])
    assert Path(exec_daemon[0]).name == compose["services"]["daemon"]["command"][0]
    assert exec_daemon[1:] == [
        *compose["services"]["daemon"]["command"][1:3],
        "/etc/rocm/workspace.yaml",
    ]
    [entry] = yaml.safe_load((SYSTEMD_DIR / "workspace.yaml").read_text())["load_from"]
    exec_server = shlex.split(server["Service"]["ExecStart"])
    assert exec_server[1:] == [
        *compose["services"]["code-location"]["command"][1:5],
        "-h",
        entry["grpc_server"]["host"],
        "-p",
        str(entry["grpc_server"]["port"]),
        "--location-name",
        entry["grpc_server"]["location_name"],
    ]
    assert CODE_SERVER_UNIT in daemon["Unit"]["After"].split()
    # systemd's own check, with the venv the units name replaced by this one.
    venv_bin = Path(sys.executable).parent
    for name in (DAEMON_UNIT, CODE_SERVER_UNIT):
        text = (SYSTEMD_DIR / name).read_text().replace(_UNIT_VENV_BIN, f"{venv_bin}/")
        (tmp_path / name).write_text(text)
    verified = _run(
        [
            "systemd-analyze",
            "verify",
            *(str(tmp_path / n) for n in (DAEMON_UNIT, CODE_SERVER_UNIT)),
        ],
        os.environ,
    )
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr


# ---- dagster.yaml ----


@pytest.fixture
def instance_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {
        "DAGSTER_POSTGRES_HOST": "postgres",
        "DAGSTER_POSTGRES_USER": "dagster",
        "DAGSTER_POSTGRES_PASSWORD": "not-a-real-password",
        "DAGSTER_POSTGRES_DB": "dagster",
        constants.BAKE_FILE_ENV: str(PROJECT_ROOT / "rocm-bake.hcl"),
        constants.FLEET_FILE_ENV: str(PROJECT_ROOT / "fleet.yaml"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def _rehydrate(section: Mapping[str, Any], as_type: type) -> Any:
    data = ConfigurableClassData(
        section["module"], section["class"], yaml.safe_dump(section["config"])
    )
    return data.rehydrate(as_type=as_type)


def test_instance_config_validates_and_its_classes_rebuild(instance_env: dict[str, str]) -> None:
    config, custom_instance = dagster_instance_config(str(DEPLOY_DIR))
    assert custom_instance is None
    # PostgreSQL through the farm's storage class, configured as `storage: postgres:` would be.
    storage = config["storage"]["custom"]
    assert (storage["module"], storage["class"]) == (PostgresStorage.__module__, "PostgresStorage")
    processed = process_config(PostgresStorage.config_type(), storage["config"])
    assert processed.success, processed.errors
    assert pg_url_from_config(processed.value).endswith("@postgres:5432/dagster")
    assert config["run_monitoring"]["enabled"] is True
    # The UI's first visit opens on the farm, not on Dagster's "Join the community" modal.
    assert config["nux"] == {"enabled": False}

    coordinator = _rehydrate(config["run_coordinator"], PlacementRunCoordinator)
    try:
        # The paths come from the env vars the config names, and the files load through them.
        assert coordinator.files.bake_file == instance_env[constants.BAKE_FILE_ENV]
        assert coordinator.files.fleet_file == instance_env[constants.FLEET_FILE_ENV]
        assert coordinator.files.graph().arches
        assert coordinator.files.fleet().nodes
    finally:
        coordinator.dispose()

    launcher = _rehydrate(config["run_launcher"], DockerRunLauncher)
    assert launcher.networks == ["rocm-farm"]
    assert all("=" not in name for name in launcher.env_vars), "values belong in the environment"
    assert launcher.container_kwargs["stop_timeout"] > 0

    logs = _rehydrate(config["compute_logs"], LocalComputeLogManager)
    assert logs._base_dir.startswith("/var/lib/dagster/")


def test_instance_config_needs_its_env_vars(
    instance_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(constants.BAKE_FILE_ENV)
    config, _ = dagster_instance_config(str(DEPLOY_DIR))
    with pytest.raises(DagsterInvalidConfigError, match=constants.BAKE_FILE_ENV):
        _rehydrate(config["run_coordinator"], PlacementRunCoordinator)


# ---- Dockerfile ----


def _dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), flags=re.MULTILINE))


def test_image_pins_match_pyproject() -> None:
    pyproject = (PROJECT_ROOT / "pyproject.toml").read_text()
    pins = dict(re.findall(r'"(dagster[\w-]*)==([\d.]+)"', pyproject))
    assert pins["dagster"] == pins["dagster-webserver"]
    postgres_pin = re.search(r"^dagster-postgres==([\d.]+)$", REQUIREMENTS.read_text(), re.M)
    assert postgres_pin is not None, "the image must install dagster-postgres, pinned"
    assert "-r /tmp/requirements.txt" in DOCKERFILE.read_text()
    # Dagster's libraries share one version line: dagster-postgres moves with dagster-docker.
    assert postgres_pin.group(1) == pins["dagster-docker"]


def test_buildx_plugin_is_pinned_to_a_version_with_history_names() -> None:
    image = _dockerfile_args()["BUILDX_IMAGE"]
    match = re.fullmatch(r"docker/buildx-bin:(\d+)\.(\d+)\.(\d+)", image)
    assert match, f"BUILDX_IMAGE={image} is not pinned to an exact version"
    assert tuple(int(part) for part in match.groups()[:2]) >= _MIN_BUILDX


def _build(
    dockerd: Dockerd, *args: str, dockerfile: Path = DOCKERFILE
) -> subprocess.CompletedProcess:
    env = dockerd.env()
    env["DOCKER_BUILDKIT"] = "1"
    argv = ["docker", "build", "--progress=plain", "-f", str(dockerfile), *args]
    return _run([*argv, str(PROJECT_ROOT)], env)


@pytest.fixture(scope="module")
def sources_image(dockerd: Dockerd) -> Iterator[str]:
    tag = f"rocm-deploy-sources:{uuid.uuid4().hex[:8]}"
    result = _build(dockerd, "--target", "sources", "-t", tag)
    assert result.returncode == 0, f"the sources stage did not build:\n{result.stderr[-3000:]}"
    yield tag
    _run(["docker", "rmi", "--force", tag], dockerd.env())


def _image_files(dockerd: Dockerd, image: str) -> set[str]:
    env = dockerd.env()
    created = _run(["docker", "create", image, "none"], env)
    assert created.returncode == 0, created.stderr
    container = created.stdout.strip()
    try:
        exported = subprocess.run(
            ["docker", "export", container], env=env, capture_output=True, check=True
        )
    finally:
        _run(["docker", "rm", container], env)
    with tarfile.open(fileobj=io.BytesIO(exported.stdout)) as tar:
        return {m.name for m in tar.getmembers() if m.isfile() and m.name.startswith("src/")}


@pytest.mark.real
def test_sources_stage_builds_with_exactly_the_project(
    dockerd: Dockerd, sources_image: str
) -> None:
    expected = {
        f"src/{path.relative_to(PROJECT_ROOT)}"
        for path in (PROJECT_ROOT / "rocm_assets").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    expected |= {"src/pyproject.toml", "src/README.md"}
    expected |= {
        f"src/deploy/{name}"
        for name in ("entrypoint.py", "dagster.yaml", "workspace.yaml", "requirements.txt")
    }
    assert _image_files(dockerd, sources_image) == expected


@pytest.mark.real
def test_whole_dockerfile_parses_and_stops_at_the_base_image_pull(
    dockerd: Dockerd, registry_server: RegistryServer
) -> None:
    # The real defaults, looked up in a loopback registry that has none of them.
    args = _dockerfile_args()
    stand_ins = {
        name: f"{registry_server.host}/{args[name]}" for name in ("PYTHON_IMAGE", "BUILDX_IMAGE")
    }
    build_args = [
        part for name, ref in stand_ins.items() for part in ("--build-arg", f"{name}={ref}")
    ]
    result = _build(dockerd, *build_args)
    assert result.returncode != 0
    final = result.stderr.strip().splitlines()[-1]
    # The frontend turned the file into a build graph and failed resolving a base image there.
    assert re.search(r"failed to create LLB definition|failed to resolve source metadata", final), (
        result.stderr[-3000:]
    )
    assert "not found" in final
    assert any(ref in final for ref in stand_ins.values()), final


@pytest.mark.real
def test_a_bad_instruction_fails_before_any_image_is_looked_up(
    dockerd: Dockerd, tmp_path: Path
) -> None:
    broken = tmp_path / "Dockerfile"
    text = DOCKERFILE.read_text()
    broken.write_text(text.replace("RUN apt-get update", "RUNN apt-get update"))
    result = _build(dockerd, dockerfile=broken)
    assert result.returncode != 0
    assert re.search(r"unknown instruction: RUNN", result.stderr, flags=re.IGNORECASE)
    assert "load metadata for" not in result.stderr


# ---- entrypoint.py ----


def _entrypoint(
    command: list[str], env: Mapping[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return _run([sys.executable, str(ENTRYPOINT), *command], env, cwd=cwd)


def _base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROCM_", "DAGSTER_", "DOCKER"))}
    env.pop("REGISTRY", None)
    env["DOCKER_CONFIG"] = str(tmp_path / "docker-config")
    return env


def test_entrypoint_writes_registry_auth_from_secret_files(tmp_path: Path) -> None:
    secret = tmp_path / "registry_password"
    secret.write_text("s3cret-pw\n")
    config_dir = tmp_path / "docker-config"
    config_dir.mkdir()
    (config_dir / "config.json").write_text(json.dumps({"credHelpers": {"gcr.io": "gcloud"}}))
    env = _base_env(tmp_path)
    env.update(
        REGISTRY="zot.snoc.lan:5000",
        ROCM_REGISTRY_URL="https://mirror.snoc.lan:5443/v2/",
        ROCM_REGISTRY_USERNAME="farm",
        ROCM_REGISTRY_PASSWORD="",
        ROCM_REGISTRY_PASSWORD_FILE=str(secret),
    )
    probe = (
        "import os, sys; sys.stdout.write(str(os.environ['ROCM_REGISTRY_PASSWORD'] == 's3cret-pw'))"
    )
    result = _entrypoint([sys.executable, "-c", probe], env)
    assert (result.returncode, result.stdout, result.stderr) == (0, "True", "")

    config_file = config_dir / "config.json"
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
    config = json.loads(config_file.read_text())
    token = base64.b64encode(b"farm:s3cret-pw").decode()
    assert config == {
        "credHelpers": {"gcr.io": "gcloud"},
        "auths": {"zot.snoc.lan:5000": {"auth": token}, "mirror.snoc.lan:5443": {"auth": token}},
    }


def test_entrypoint_without_credentials_writes_nothing(tmp_path: Path) -> None:
    env = _base_env(tmp_path)
    env["REGISTRY"] = "zot.snoc.lan:5000"
    result = _entrypoint([sys.executable, "-c", "pass"], env)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "docker-config").exists()


@pytest.mark.parametrize(
    ("settings", "command", "message"),
    [
        (
            {"ROCM_REGISTRY_PASSWORD_FILE": "/nonexistent/registry_password"},
            ["true"],
            "ROCM_REGISTRY_PASSWORD_FILE=/nonexistent/registry_password: cannot read it: "
            "No such file or directory",
        ),
        (
            {"ROCM_REGISTRY_USERNAME": "farm", "ROCM_REGISTRY_PASSWORD": "pw-9f3k"},
            ["true"],
            "ROCM_REGISTRY_USERNAME/PASSWORD are set but neither REGISTRY nor ROCM_REGISTRY_URL "
            "names the registry they are for",
        ),
        ({}, [], "no command to run"),
        (
            {},
            ["/nonexistent/dagster"],
            "cannot run '/nonexistent/dagster': No such file or directory",
        ),
    ],
)
def test_entrypoint_errors_are_one_line(
    tmp_path: Path, settings: dict[str, str], command: list[str], message: str
) -> None:
    env = _base_env(tmp_path)
    env.update(settings)
    result = _entrypoint(command, env)
    assert result.returncode == 2
    assert result.stderr == f"rocm-assets entrypoint: {message}\n"
    assert "pw-9f3k" not in result.stderr


@pytest.mark.real
def test_entrypoint_auth_lets_the_real_client_push(
    dockerd: Dockerd, registry_server_auth: RegistryServer, sources_image: str, tmp_path: Path
) -> None:
    server = registry_server_auth
    password = str(server.password)
    ref = f"{server.host}/{server.new_repo('rocm/deploy-sources')}:test"
    engine_env = dockerd.env()
    tagged = _run(["docker", "tag", sources_image, ref], engine_env)
    assert tagged.returncode == 0, tagged.stderr

    # Without the entrypoint's auth the registry refuses the push.
    anonymous = dict(engine_env, DOCKER_CONFIG=str(tmp_path / "anonymous"))
    refused = _run(["docker", "push", ref], anonymous)
    assert refused.returncode != 0
    assert re.search(r"no basic auth credentials|unauthorized", refused.stderr), refused.stderr

    secret = tmp_path / "registry_password"
    secret.write_text(password)
    env = dict(engine_env)
    env.update(
        DOCKER_CONFIG=str(tmp_path / "docker-config"),
        REGISTRY=server.host,
        ROCM_REGISTRY_USERNAME=str(server.username),
        ROCM_REGISTRY_PASSWORD_FILE=str(secret),
    )
    env.pop("ROCM_REGISTRY_PASSWORD", None)
    pushed = _entrypoint(["docker", "push", ref], env)
    assert pushed.returncode == 0, pushed.stderr
    assert password not in pushed.stdout + pushed.stderr

    repo, tag = ref.removeprefix(f"{server.host}/").rsplit(":", 1)
    tags = httpx.get(
        f"{server.url}/v2/{repo}/tags/list", auth=(str(server.username), password), trust_env=False
    )
    assert tags.status_code == 200
    assert tags.json()["tags"] == [tag]
