"""deploy/ for real: the farm's images built, `docker compose up`, one partition materialized
through the webserver's GraphQL, and the farm's state across `down` and `up`; then each bad
setting the deployment must survive.

Real, all of it, on the machine's own dockerd 26 (vfs, no default bridge):
- The base images from Debian packages with `deploy/base-images.sh` (debootstrap minbase, Python
  3.11, buildx, PostgreSQL), the farm image with `docker compose build` (Compose v2, Debian 13's
  2.26, which .ci/setup unpacks), its wheels from a wheelhouse the host's pip filled (the engine's
  builds reach Debian's mirror but no package index of their own).
- The compose file as shipped, plus rocm_assets_tests/fixtures/deploy/compose.test.yaml: the
  build's network, a subnet for the farm network, and a registry in it (the real docker-registry
  behind htpasswd). Everything else (PostgreSQL storage, the code server, the webserver, the
  daemon with PlacementRunCoordinator, DockerRunLauncher) is deploy/ unchanged.
- The build node is a second dockerd whose socket lies in ROCM_ETC_DIR, so it is inside every
  farm container and run worker at /etc/rocm/nodes/node1.sock; the farm reaches it through a docker
  context made with the compose `docker` tool, as an operator adds a node. Its BuildKit pushes
  to the registry through the farm network's bridge.

The engine's data root persists across sessions (ROCM_TEST_DEPLOY_ROOT, default
/var/tmp/rocm-assets-deploy), so base images and the image build's cache are reused: a first
session on a fresh machine builds everything (about 10 minutes on 2 busy cores), later ones only
what changed. The farm itself (containers, volumes) is made anew each session.
"""

import ipaddress
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest

from rocm_assets.core.build.invocation import build_name
from rocm_assets_tests.helpers import PROJECT_ROOT, free_port, locked, write_fleet
from rocm_assets_tests.servers.dockerd import (
    E2E_DIR,
    Dockerd,
    make_builders,
    place_busybox,
    remove_root,
    start_dockerd,
    stop_dockerd,
)

pytestmark = [pytest.mark.real, pytest.mark.slow]

DEPLOY_DIR = PROJECT_ROOT / "deploy"
COMPOSE_FILE = DEPLOY_DIR / "docker-compose.yaml"
OVERRIDE_FILE = PROJECT_ROOT / "rocm_assets_tests" / "fixtures" / "deploy" / "compose.test.yaml"
DEPLOY_ROOT = Path(os.environ.get("ROCM_TEST_DEPLOY_ROOT", "/var/tmp/rocm-assets-deploy"))
# Compose v2: the docker CLI's plugin if it has one, else Debian 13's, unpacked by .ci/setup.
COMPOSE_PLUGIN = Path(
    os.environ.get("ROCM_TEST_COMPOSE", "/opt/rocm-assets/compose-2/docker-compose")
)
IMAGE = "rocm-assets:deploy-test"
LOCATION = "rocm_assets"
NODE = "node1"
GONE = "gone"
TARGET = "base"
ARCH = "gfx942"
# The farm image's user: the node's socket is made for its group.
DAGSTER_GID = 10001
REGISTRY_USER = "farm"
_BUILD_TIMEOUT_S = 2400
_UP_TIMEOUT_S = 900
_RUN_TIMEOUT_S = 600
_POLL_S = 2.0
_FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

_LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
_RUN = """
query Run($id: ID!) {
  runOrError(runId: $id) {
    __typename
    ... on Run {
      status
      tags { key value }
      eventConnection {
        events {
          __typename
          ... on MessageEvent { message }
          ... on ExecutionStepFailureEvent { error { message } }
          ... on MaterializationEvent {
            partition
            metadataEntries {
              label
              ... on TextMetadataEntry { text }
            }
          }
        }
      }
    }
  }
}
"""
_LOCATION = """
query Location {
  workspaceOrError {
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on PythonError { message errorChain { error { message } } }
        }
      }
    }
  }
}
"""
_RELOAD = """
mutation Reload($name: String!) {
  reloadRepositoryLocation(repositoryLocationName: $name) {
    __typename
    ... on WorkspaceLocationEntry {
      loadStatus
      locationOrLoadError {
        __typename
        ... on PythonError { message errorChain { error { message } } }
      }
    }
  }
}
"""
_RUNS = """
query Runs {
  runsOrError(limit: 1) {
    __typename
    ... on Runs { results { runId } }
    ... on PythonError { message }
  }
}
"""
_MATERIALIZATIONS = """
query Materializations($key: AssetKeyInput!, $partitions: [String!]) {
  assetOrError(assetKey: $key) {
    ... on Asset {
      assetMaterializations(partitions: $partitions) {
        runId
        partition
        metadataEntries {
          label
          ... on TextMetadataEntry { text }
        }
      }
    }
  }
}
"""


class DeployTestError(AssertionError):
    """A step of bringing the farm up failed; the message says which and how."""


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _docker_client_config(root: Path) -> Path:
    """A docker client config of the test's own whose compose plugin is v2."""
    config = root / "client"
    plugins = config / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    link = plugins / "docker-compose"
    if not link.is_symlink() or Path(os.readlink(link)) != COMPOSE_PLUGIN:
        if not os.access(COMPOSE_PLUGIN, os.X_OK):
            pytest.fail(
                f"Compose v2 is not at {COMPOSE_PLUGIN}: .ci/setup unpacks Debian 13's "
                "docker-compose there (or set ROCM_TEST_COMPOSE)",
                pytrace=False,
            )
        link.unlink(missing_ok=True)
        link.symlink_to(COMPOSE_PLUGIN)
    return config


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 for the farm network that no route of this host overlaps."""
    routes = subprocess.run(
        ["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True, check=True
    ).stdout
    used = []
    for line in routes.splitlines():
        words = line.split()
        for word in words[:2]:
            try:
                used.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    for third in range(240, 160, -1):
        candidate = ipaddress.ip_network(f"172.31.{third}.0/24")
        if not any(candidate.overlaps(net) for net in used if net.prefixlen > 0):
            return candidate
    pytest.fail("no free /24 in 172.31.161-240.0 for the farm network", pytrace=False)


def _fill_wheelhouse(wheelhouse: Path) -> None:
    """Every wheel the image installs, downloaded by this host's pip (reused while the project's
    and deploy/'s requirements are unchanged)."""
    stamp = wheelhouse / ".requirements"
    wanted = (PROJECT_ROOT / "pyproject.toml").read_text() + (
        DEPLOY_DIR / "requirements.txt"
    ).read_text()
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    wheelhouse.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheelhouse),
         str(PROJECT_ROOT), "-r", str(DEPLOY_DIR / "requirements.txt"), "setuptools>=68"],
        capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise DeployTestError(f"pip download for the wheelhouse failed:\n{_tail(done.stderr)}")
    stamp.write_text(wanted)


def _base_images(env: Mapping[str, str]) -> dict[str, str]:
    """deploy/base-images.sh on the farm engine: the deploy/.env lines it prints, as a dict."""
    done = subprocess.run(
        ["bash", str(DEPLOY_DIR / "base-images.sh")],
        env=dict(env), capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise DeployTestError(f"deploy/base-images.sh failed:\n{_tail(done.stderr)}")
    return dict(
        line.split("=", 1) for line in done.stdout.splitlines() if re.match(r"^ROCM_\w+=", line)
    )


@dataclass
class Farm:
    """The running deployment and the ways the tests reach it."""

    engine: Dockerd
    node: Dockerd
    env: dict[str, str]
    env_file: Path
    dirs: dict[str, Path]
    settings: dict[str, str]
    url: str
    registry: str
    logs: Path
    _extra_env_files: list[Path] = field(default_factory=list)

    # ---- compose and docker ----
    def compose(
        self, *args: str, env_files: tuple[Path, ...] = (), timeout: float = _UP_TIMEOUT_S
    ) -> subprocess.CompletedProcess:
        files = [part for f in (self.env_file, *env_files) for part in ("--env-file", str(f))]
        argv = ["docker", "compose", *files, "-f", str(COMPOSE_FILE), "-f", str(OVERRIDE_FILE)]
        return subprocess.run(
            [*argv, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
            check=False, cwd=PROJECT_ROOT,
        )  # fmt: skip

    def ok(
        self, *args: str, env_files: tuple[Path, ...] = (), timeout: float = _UP_TIMEOUT_S
    ) -> str:
        done = self.compose(*args, env_files=env_files, timeout=timeout)
        if done.returncode != 0:
            raise DeployTestError(
                f"docker compose {' '.join(args)} failed ({done.returncode}):\n"
                f"{_tail(done.stderr)}\n{self.service_logs()}"
            )
        return done.stdout

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(
            ["docker", *args], env=self.env, capture_output=True, text=True, timeout=300,
            check=False,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise DeployTestError(f"docker {' '.join(args)} failed: {_tail(done.stderr, 5)}")
        return done

    def remove(self, check: bool = True) -> None:
        """The farm's containers, run workers and volumes, the tools profile's too (a plain
        `down --volumes` keeps those, and a docker context would outlive the farm)."""
        down = self.compose("--profile", "tools", "down", "--volumes", "--remove-orphans",
                            timeout=300)  # fmt: skip
        if check and down.returncode != 0:
            raise DeployTestError(f"removing the farm failed:\n{_tail(down.stderr)}")
        self.docker("container", "prune", "--force", "--filter",
                    "label=org.rocm-assets.role=run-worker", check=False)  # fmt: skip

    def service_logs(self, *services: str, lines: int = 30) -> str:
        done = self.compose("logs", "--no-color", "--tail", str(lines), *services, timeout=120)
        return done.stdout + done.stderr

    def logs_of(self, service: str) -> list[str]:
        """The service's log lines, without compose's `service-1  | ` prefix."""
        done = self.compose("logs", "--no-color", "--no-log-prefix", service, timeout=120)
        # Compose 2.26 starts each line with an erase-line escape even with --no-color.
        lines = (_ANSI.sub("", line).strip() for line in done.stdout.splitlines())
        return [line for line in lines if line]

    def state(self, service: str) -> dict[str, Any]:
        name = f"rocm-farm-{service}-1"
        out = self.docker("inspect", "--format", "{{json .}}", name).stdout
        info = json.loads(out)
        return {
            "status": info["State"]["Status"],
            "restarts": info["RestartCount"],
            "health": (info["State"].get("Health") or {}).get("Status"),
        }

    def psql(self, sql: str) -> str:
        user, db = self.settings["DAGSTER_POSTGRES_USER"], self.settings["DAGSTER_POSTGRES_DB"]
        return self.ok(
            "exec", "-T", "postgres", "psql", "--username", user, "--dbname", db,
            "--no-align", "--tuples-only", "--command", sql,
            timeout=120,
        ).strip()  # fmt: skip

    # ---- the webserver ----
    def graphql(self, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        reply = httpx.post(
            f"{self.url}/graphql",
            json={"query": query, "variables": dict(variables or {})},
            timeout=120,
            trust_env=False,
        )
        body = reply.json()
        if body.get("errors"):
            raise DeployTestError(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def location(self) -> dict[str, Any]:
        entries = self.graphql(_LOCATION)["workspaceOrError"]["locationEntries"]
        return next(e for e in entries if e["name"] == LOCATION)

    def wait_loaded(self, timeout: float = _UP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.location()
            except (httpx.HTTPError, DeployTestError, ValueError) as exc:
                last = exc
            else:
                if (
                    last["loadStatus"] == "LOADED"
                    and last["locationOrLoadError"]["__typename"] == "RepositoryLocation"
                ):
                    return
            time.sleep(_POLL_S)
        raise DeployTestError(f"the code location did not load: {last}\n{self.service_logs()}")

    def launch(self, target: str, partition: str) -> str:
        params = {
            "selector": {
                "repositoryLocationName": LOCATION,
                "repositoryName": "__repository__",
                "jobName": "__ASSET_JOB",
                "assetSelection": [{"path": [target]}],
            },
            "runConfigData": {},
            "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]},
        }
        result = self.graphql(_LAUNCH, {"params": params})["launchRun"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return result["run"]["runId"]

    def run(self, run_id: str) -> dict[str, Any]:
        found = self.graphql(_RUN, {"id": run_id})["runOrError"]
        assert found["__typename"] == "Run", found
        return found

    def wait_run(self, run_id: str, timeout: float = _RUN_TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.run(run_id)
            if run["status"] in _FINISHED:
                return run
            time.sleep(_POLL_S)
        raise DeployTestError(
            f"run {run_id} did not finish in {timeout:.0f} s: {self.run(run_id)['status']}\n"
            f"{self.service_logs('daemon')}"
        )

    def env_override(self, name: str, **values: str) -> Path:
        path = self.env_file.with_name(f"{name}.env")
        path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        return path

    def wait_healthy(self, service: str, timeout: float = _UP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state(service)["health"] == "healthy":
                return
            time.sleep(_POLL_S)
        raise DeployTestError(f"{service} did not become healthy:\n{self.service_logs(service)}")


def _tags(run: Mapping[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["tags"]}


def _messages(run: Mapping[str, Any]) -> list[str]:
    return [e.get("message") or "" for e in run["eventConnection"]["events"]]


def _step_failures(run: Mapping[str, Any]) -> list[str]:
    return [
        e["error"]["message"]
        for e in run["eventConnection"]["events"]
        if e["__typename"] == "ExecutionStepFailureEvent" and e.get("error")
    ]


def _metadata(entries: list[dict[str, Any]]) -> dict[str, str | None]:
    return {e["label"]: e.get("text") for e in entries}


def _one_line(message: str) -> str:
    """A Dagster error message without its exception class; it must be a single line."""
    text = message.strip()
    assert "\n" not in text, f"not one line:\n{text}"
    return text.split(": ", 1)[1] if re.match(r"^[\w.]+(Error|Failure|Exception)\b", text) else text


def _write_registry(directory: Path, username: str, password: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    (directory / "htpasswd").write_text(f"{username}:{hashed}\n")
    (directory / "config.yml").write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        "storage:\n  filesystem: {rootdirectory: /var/lib/docker-registry}\n"
        "http: {addr: '0.0.0.0:5000'}\n"
        "auth:\n  htpasswd: {realm: rocm-farm-test, path: /etc/docker-registry/htpasswd}\n"
    )
    for path in (directory, *directory.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    """The deployment, up: images built (or reused), node and registry ready, `up --wait` done."""
    started = time.monotonic()
    # One session at a time on the persistent engine root.
    with locked(DEPLOY_ROOT / "lock"):
        engine_proc, engine = start_dockerd(DEPLOY_ROOT / "engine", DEPLOY_ROOT / "engine.log")
        node_root = Path(tempfile.mkdtemp(prefix="rocm-deploy-node-"))
        # What _bring_up got as far as starting, for the teardown.
        made: dict[str, Any] = {}
        try:
            yield _bring_up(tmp_path_factory, engine, node_root, started, made)
        finally:
            farm = made.get("farm")
            if farm is not None:
                (farm.logs / "compose.log").write_text(farm.service_logs(lines=2000))
                farm.remove(check=False)
                # Images a rebuild replaced: on vfs each is gigabytes.
                farm.docker("image", "prune", "--force", check=False)
            if "node" in made:
                stop_dockerd(made["node"])
            remove_root(node_root)
            stop_dockerd(engine_proc)


def _bring_up(
    tmp_path_factory: pytest.TempPathFactory,
    engine: Dockerd,
    node_root: Path,
    started: float,
    made: dict[str, Any],
) -> Farm:
    work = tmp_path_factory.mktemp("deploy")
    logs = work / "logs"
    logs.mkdir()
    env = dict(os.environ)
    env.pop("DOCKER_CONTEXT", None)
    env["DOCKER_HOST"] = engine.host
    env["DOCKER_CONFIG"] = str(_docker_client_config(DEPLOY_ROOT))

    # The site's directories, as an operator lays them out (deploy/README.md).
    dirs = {name: work / name for name in ("bake", "etc", "ssh", "registry")}
    for path in dirs.values():
        path.mkdir()
    place_busybox(E2E_DIR)
    for source in E2E_DIR.iterdir():
        if source.is_file() and not source.name.startswith("."):
            shutil.copy2(source, dirs["bake"] / source.name)
    (dirs["etc"] / "nodes").mkdir()
    write_fleet(dirs["etc"] / "fleet.yaml", [{"name": NODE}], cores=4, mem_gb=8.0, link_mbps=1000.0)
    for path in (dirs["bake"], dirs["etc"], dirs["etc"] / "nodes"):
        path.chmod(0o755)
        for child in path.iterdir():
            if child.is_file():
                child.chmod(0o755 if os.access(child, os.X_OK) else 0o644)
    os.chown(dirs["ssh"], DAGSTER_GID, DAGSTER_GID)
    dirs["ssh"].chmod(0o700)

    subnet = _free_subnet()
    registry_ip = str(subnet.network_address + 10)
    registry = f"{registry_ip}:5000"
    password = secrets.token_urlsafe(16)
    _write_registry(dirs["registry"], REGISTRY_USER, password)

    wheelhouse = DEPLOY_ROOT / "wheelhouse"
    _fill_wheelhouse(wheelhouse)
    base = _base_images(env)
    settings = {
        "COMPOSE_PROJECT_NAME": "rocm-farm",
        "ROCM_DAGSTER_IMAGE": IMAGE,
        "DAGSTER_POSTGRES_USER": "dagster",
        "DAGSTER_POSTGRES_PASSWORD": secrets.token_urlsafe(16),
        "DAGSTER_POSTGRES_DB": "dagster",
        "DOCKER_GID": str(os.stat(engine.host.removeprefix("unix://")).st_gid),
        "ROCM_DOCKER_SOCKET": engine.host.removeprefix("unix://"),
        "ROCM_BAKE_DIR": str(dirs["bake"]),
        "ROCM_ETC_DIR": str(dirs["etc"]),
        "ROCM_SSH_DIR": str(dirs["ssh"]),
        "ROCM_BAKE_FILE": "/opt/rocm-bake/bake.hcl",
        "REGISTRY": registry,
        "ROCM_REGISTRY_URL": f"http://{registry}",
        "ROCM_REGISTRY_USERNAME": REGISTRY_USER,
        "ROCM_REGISTRY_PASSWORD": password,
        "ROCM_WEBSERVER_BIND": f"127.0.0.1:{free_port()}",
        # The tests launch each run themselves; automation would build the other partitions too.
        "ROCM_AUTOMATION": "off",
        **base,
        "ROCM_WHEELHOUSE": str(wheelhouse),
        "ROCM_PIP_NO_INDEX": "1",
        "ROCM_TEST_SUBNET": str(subnet),
        "ROCM_TEST_REGISTRY_IP": registry_ip,
        "ROCM_TEST_REGISTRY_IMAGE": base["ROCM_PYTHON_IMAGE"].replace("/python:3.11-", "/debian:"),
        "ROCM_TEST_REGISTRY_DIR": str(dirs["registry"]),
    }
    env_file = work / "farm.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    farm = Farm(
        engine=engine,
        node=engine,
        env=env,
        env_file=env_file,
        dirs=dirs,
        settings=settings,
        url=f"http://{settings['ROCM_WEBSERVER_BIND']}",
        registry=registry,
        logs=logs,
    )
    made["farm"] = farm
    # What a session that died left behind on the persistent engine.
    farm.remove()

    node_proc, node = start_dockerd(
        node_root, logs / "node.log",
        extra=("--insecure-registry", registry, "--host",
               f"unix://{dirs['etc'] / 'nodes' / f'{NODE}.sock'}", "--group", str(DAGSTER_GID)),
    )  # fmt: skip
    made["node"] = node_proc
    farm.node = node

    built = time.monotonic()
    farm.ok("build", "code-location", timeout=_BUILD_TIMEOUT_S)
    (logs / "timing").write_text(f"images ready after {time.monotonic() - started:.0f} s\n")
    # The nodes' builders, as deploy/README.md adds them: a docker context per node.
    for name in (NODE, GONE):
        farm.ok("run", "--rm", "docker", "context", "create", name,
                "--docker", f"host=unix:///etc/rocm/nodes/{name}.sock")  # fmt: skip
    farm.ok("up", "--detach", "--no-build", "--wait")
    farm.wait_loaded()
    with (logs / "timing").open("a") as out:
        out.write(f"farm up {time.monotonic() - built:.0f} s after the build started\n")
    return farm


@pytest.fixture(scope="module")
def materialized(farm: Farm) -> dict[str, Any]:
    """base@gfx942 launched through GraphQL as the UI does, and finished."""
    run_id = farm.launch(TARGET, ARCH)
    run = farm.wait_run(run_id)
    assert run["status"] == "SUCCESS", (
        f"{_step_failures(run)}\n{_messages(run)[-15:]}\n{farm.service_logs('daemon')}"
    )
    return {"run_id": run_id, **run}


def _materialization(run: Mapping[str, Any]) -> dict[str, str | None]:
    found = [
        e for e in run["eventConnection"]["events"] if e["__typename"] == "MaterializationEvent"
    ]
    assert len(found) == 1, found
    assert found[0]["partition"] == ARCH
    return _metadata(found[0]["metadataEntries"])


def _registry_digest(farm: Farm, repo: str, tag: str) -> str:
    reply = httpx.head(
        f"http://{farm.registry}/v2/{repo}/manifests/{tag}",
        auth=(REGISTRY_USER, farm.settings["ROCM_REGISTRY_PASSWORD"]),
        headers={
            "Accept": ", ".join(
                [
                    "application/vnd.oci.image.index.v1+json",
                    "application/vnd.oci.image.manifest.v1+json",
                    "application/vnd.docker.distribution.manifest.list.v2+json",
                    "application/vnd.docker.distribution.manifest.v2+json",
                ]
            )
        },
        timeout=30,
        trust_env=False,
    )
    assert reply.status_code == 200, reply.status_code
    return reply.headers["Docker-Content-Digest"]


# ---- the farm at work ----


def test_a_partition_runs_in_its_own_container_placed_and_baked_on_the_node(
    farm: Farm, materialized: dict[str, Any], tmp_path: Path
) -> None:
    run_id = materialized["run_id"]
    # Its own container, started by DockerRunLauncher from the farm image, on the farm network.
    containers = farm.docker(
        "ps", "--all", "--filter", f"label=dagster/run_id={run_id}", "--format", "{{json .}}"
    ).stdout.splitlines()
    assert len(containers) == 1, containers
    info = json.loads(farm.docker("inspect", json.loads(containers[0])["ID"]).stdout)[0]
    assert info["Config"]["Image"] == IMAGE
    assert info["Config"]["Labels"]["org.rocm-assets.role"] == "run-worker"
    assert info["Config"]["Cmd"][:3] == ["dagster", "api", "execute_run"]
    assert set(info["NetworkSettings"]["Networks"]) == {"rocm-farm"}
    assert info["State"]["ExitCode"] == 0

    # Placed by the coordinator in the daemon: the node's builder was claimed for it.
    tags = _tags(materialized)
    assert (tags["rocm/node"], tags["rocm/builder"], tags["rocm/placement"]) == (
        NODE,
        NODE,
        "placed",
    )
    assert any(m.startswith(f"placed {TARGET}@{ARCH} on {NODE} ") for m in _messages(materialized))

    # Baked on the node's own engine, under the run's build name, and pushed to the registry.
    builders = make_builders(tmp_path / "docker-config", {NODE: farm.node})
    records = builders.history(NODE, build_name(TARGET, ARCH, run_id))
    assert len(records) == 1, records
    meta = _materialization(materialized)
    assert meta["history_ref"] == f"{NODE}/{NODE}/{records[0].ref.rsplit('/', 1)[-1]}"
    assert meta["node"] == NODE
    assert meta["digest"] == _registry_digest(farm, f"e2e/{TARGET}", ARCH)

    # Stored in PostgreSQL, as the run and its materialization.
    assert farm.psql(f"SELECT status FROM runs WHERE run_id = '{run_id}'") == "SUCCESS"
    events = farm.psql(
        "SELECT count(*) FROM event_logs "
        f"WHERE run_id = '{run_id}' AND dagster_event_type = 'ASSET_MATERIALIZATION'"
    )
    assert events == "1"

    # The farm's own view from inside the deployment, as deploy/README.md shows an operator.
    view = farm.ok("exec", "-T", "daemon", "rocm-assets", "watch", "--once",
                   "--url", "http://webserver:3000")  # fmt: skip
    assert re.search(r"nodes busy 0/1\b", view), view
    assert re.search(rf"^  {NODE}\s.*\bidle\b", view, flags=re.M), view


def test_runs_materializations_and_the_coordinator_survive_down_and_up(
    farm: Farm, materialized: dict[str, Any]
) -> None:
    run_id = materialized["run_id"]
    pool = f"rocm-builder/{NODE}"
    pools = "SELECT concurrency_key FROM concurrency_limits"
    assert pool in farm.psql(pools).splitlines()

    farm.ok("down")
    assert not farm.ok("ps", "--all", "--quiet").strip()
    farm.ok("up", "--detach", "--no-build", "--wait")
    farm.wait_loaded()

    again = farm.run(run_id)
    assert again["status"] == "SUCCESS"
    assert _tags(again) == _tags(materialized)
    assert _materialization(again) == _materialization(materialized)
    assert pool in farm.psql(pools).splitlines()
    found = farm.graphql(_MATERIALIZATIONS, {"key": {"path": [TARGET]}, "partitions": [ARCH]})
    records = found["assetOrError"]["assetMaterializations"]
    assert [r["runId"] for r in records] == [run_id]
    # The coordinator's state: the node's builder pool, free (no run holds it).
    slots = farm.psql(
        f"SELECT coalesce(run_id, '') FROM concurrency_slots WHERE concurrency_key = '{pool}'"
    )
    assert slots == ""
    # And it places again after the restart: the other arch, on the same node.
    second = farm.wait_run(farm.launch(TARGET, "gfx1100"))
    assert second["status"] == "SUCCESS", _step_failures(second)
    assert _tags(second)["rocm/node"] == NODE


# ---- bad settings: one line each, and no crash loop ----


def _wait_for_line(farm: Farm, service: str, pattern: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not any(re.fullmatch(pattern, line) for line in farm.logs_of(service)):
        assert time.monotonic() < deadline, f"no line {pattern!r}:\n{farm.service_logs(service)}"
        time.sleep(_POLL_S)


def test_the_daemon_waits_for_postgres_and_says_so(farm: Farm) -> None:
    waiting = "rocm-assets entrypoint: waiting for PostgreSQL at postgres:5432: "
    farm.ok("stop", "postgres")
    try:
        farm.ok("up", "--detach", "--no-deps", "--force-recreate", "daemon")
        _wait_for_line(farm, "daemon", re.escape(waiting) + ".+")
        # It keeps waiting, quietly: one line (the next comes after a minute), no restart.
        time.sleep(10)
        lines = farm.logs_of("daemon")
        assert len(lines) == 1, lines
        assert lines[0].startswith(waiting + 'could not translate host name "postgres"'), lines
        assert (farm.state("daemon")["status"], farm.state("daemon")["restarts"]) == ("running", 0)
    finally:
        farm.ok("start", "postgres")
    _wait_for_line(
        farm, "daemon", r"rocm-assets entrypoint: PostgreSQL at postgres:5432 is up after \d+ s"
    )
    farm.wait_healthy("daemon")
    assert not [line for line in farm.logs_of("daemon") if "Traceback" in line]
    assert farm.state("daemon")["restarts"] == 0
    # The webserver stayed up throughout, and its pooled connections, which PostgreSQL's restart
    # ended, are replaced before use (rocm_assets/instance/postgres.py): the first requests after
    # it, a run list and a launch, answer as before.
    assert farm.graphql(_RUNS)["runsOrError"]["__typename"] == "Runs"
    run = farm.wait_run(farm.launch(TARGET, ARCH))
    assert run["status"] == "SUCCESS", _step_failures(run)
    assert farm.state("webserver")["restarts"] == 0


def test_a_missing_registry_credential_is_one_line(farm: Farm) -> None:
    no_password = farm.env_override("no-password", ROCM_REGISTRY_PASSWORD="")
    farm.ok("up", "--detach", "--no-deps", "--force-recreate", "daemon", env_files=(no_password,))
    try:
        farm.wait_healthy("daemon")
        said = [
            line for line in farm.logs_of("daemon") if line.startswith("rocm-assets entrypoint:")
        ]
        assert said == [
            "rocm-assets entrypoint: ROCM_REGISTRY_USERNAME is set but ROCM_REGISTRY_PASSWORD is "
            f"empty: no registry auth written, so {farm.registry} will refuse pushes and reads "
            "that need one; set ROCM_REGISTRY_PASSWORD (or ROCM_REGISTRY_PASSWORD_FILE)"
        ]
        run_id = farm.launch(TARGET, ARCH)
        run = farm.wait_run(run_id)
        assert run["status"] == "FAILURE"
        (failure,) = _step_failures(run)
        # Preflight refuses the half-set credential before any build or request, naming both
        # variables, rather than letting the registry answer 401 mid-build.
        assert _one_line(failure) == (
            "preflight could not check the run's inputs, no build started: registry "
            f"http://{farm.registry}: set both ROCM_REGISTRY_USERNAME and ROCM_REGISTRY_PASSWORD, "
            "or neither"
        )
        assert farm.settings["ROCM_REGISTRY_PASSWORD"] not in failure
        assert farm.state("daemon")["restarts"] == 0
    finally:
        farm.ok("up", "--detach", "--no-deps", "--force-recreate", "daemon")
        farm.wait_healthy("daemon")


def test_an_unreachable_node_fails_its_run_in_one_line(farm: Farm) -> None:
    fleet = farm.dirs["etc"] / "fleet.yaml"
    shipped = fleet.read_text()
    write_fleet(fleet, [{"name": GONE}], cores=4, mem_gb=8.0, link_mbps=1000.0)
    fleet.chmod(0o644)
    try:
        run = farm.wait_run(farm.launch(TARGET, ARCH))
    finally:
        fleet.write_text(shipped)
    assert run["status"] == "FAILURE"
    assert _tags(run)["rocm/node"] == GONE
    (failure,) = _step_failures(run)
    reason = _one_line(failure)
    assert reason.startswith(f"{TARGET} ({ARCH}) on {GONE}: "), reason
    assert f"unix:///etc/rocm/nodes/{GONE}.sock" in reason
    # The claim went with the run, and the daemon carries on.
    assert (
        farm.psql(
            "SELECT coalesce(run_id, '') FROM concurrency_slots "
            f"WHERE concurrency_key = 'rocm-builder/{GONE}'"
        )
        == ""
    )
    assert farm.state("daemon") == {"status": "running", "restarts": 0, "health": "healthy"}


def test_a_code_location_that_fails_to_load_shows_one_line_in_the_ui(farm: Farm) -> None:
    bake = farm.dirs["bake"] / "bake.hcl"
    moved = bake.with_name("bake.hcl.moved")
    bake.rename(moved)
    try:
        entry = farm.graphql(_RELOAD, {"name": LOCATION})["reloadRepositoryLocation"]
        error = entry["locationOrLoadError"]
        assert error["__typename"] == "PythonError", error
        causes = [_one_line(link["error"]["message"]) for link in error["errorChain"]]
        assert causes == ["/opt/rocm-bake/bake.hcl: bake file not found"], error
        assert farm.state("code-location")["status"] == "running"
        assert farm.state("code-location")["restarts"] == 0
    finally:
        moved.rename(bake)
    entry = farm.graphql(_RELOAD, {"name": LOCATION})["reloadRepositoryLocation"]
    assert entry["locationOrLoadError"]["__typename"] == "RepositoryLocation", entry


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--env", "ROCM_REGISTRY_PASSWORD_FILE=/nonexistent/registry_password"],
            "ROCM_REGISTRY_PASSWORD_FILE=/nonexistent/registry_password: cannot read it: "
            "No such file or directory",
        ),
        (
            ["--volume", "{socket}:/var/run/docker.sock", "--group-add", "4242"],
            "/var/run/docker.sock: permission denied for uid 10001 with groups [4242, 10001]: "
            "set DOCKER_GID to the socket's group on the host (stat -c %g /var/run/docker.sock)",
        ),
    ],
    ids=["unreadable-secret", "wrong-docker-gid"],
)
def test_a_bad_setting_holds_in_one_line_instead_of_crash_looping(
    farm: Farm, args: list[str], line: str
) -> None:
    socket_path = farm.engine.host.removeprefix("unix://")
    name = f"rocm-deploy-hold-{secrets.token_hex(4)}"
    farm.docker(
        "run", "--detach", "--name", name, "--restart", "unless-stopped", "--network", "none",
        "--env", "ROCM_ENTRYPOINT_ON_ERROR=hold",
        *[a.replace("{socket}", socket_path) for a in args],
        IMAGE, "dagster-daemon", "run",
    )  # fmt: skip
    try:
        time.sleep(8)
        info = json.loads(farm.docker("inspect", name).stdout)[0]
        logs = farm.docker("logs", name)
        said = (logs.stdout + logs.stderr).strip().splitlines()
        assert (info["State"]["Status"], info["RestartCount"]) == ("running", 0)
        assert len(said) == 1, said
        assert said == [
            f"rocm-assets entrypoint: {line} (holding until stopped: fix it, then "
            "`docker compose up -d`)"
        ]
        stopped = time.monotonic()
        farm.docker("stop", "--time", "30", name)
        assert time.monotonic() - stopped < 10
    finally:
        farm.docker("rm", "--force", name, check=False)
