"""Rebuild only what changed: code versions, staleness and the automation sensor on a real farm.

Real, in every test here: a copy of the example farm (examples/farm: five targets, two arches,
nine builds) built by Debian's `docker buildx bake` (buildx 0.29) on Debian 13's dockerd 26 and
pushed to Debian's docker-registry; a persistent SQLite Dagster instance with rocm-assets'
PlacementRunCoordinator and Dagster's DefaultRunLauncher; the code location as shipped, loaded by
a gRPC code server; the automation sensor evaluated by the real sensor daemon's iteration
(`execute_sensor_iteration`), its runs placed and launched by the real queued-run daemon's
iteration into run workers. What was built is read from BuildKit's own history on the builder.

Stand-ins: none. The two fleet nodes are two docker contexts on one engine, not probed.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
from dagster._core.remote_representation.external import RemoteSensor
from dagster._core.scheduler.instigation import TickStatus
from dagster._core.test_utils import create_test_daemon_workspace_context, instance_for_test
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import ModuleTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster._daemon.sensor import execute_sensor_iteration

from rocm_assets.core.bake import load_graph
from rocm_assets.core.build.versions import definitions
from rocm_assets.defs.assets import build_bake_assets
from rocm_assets.defs.automation import SENSOR_NAME
from rocm_assets_tests.servers.dockerd import Builders, Dockerd, make_builders, place_busybox
from rocm_assets_tests.servers.registry import RegistryServer

FARM = Path(__file__).resolve().parent.parent / "examples" / "farm"
PROJECT_ROOT = FARM.parent.parent
LOCATION = "rocm_assets"
NODES = ("auto-a", "auto-b")
ARCHES = ("gfx942", "gfx1100")
EVERY_BUILD = {
    *((t, a) for t in ("runtime", "base", "torch", "torch-wheel") for a in ARCHES),
    ("src", None),
}
# A guard against a hung farm, not a timing: each build takes seconds.
HANG_GUARD_S = 600.0
INTERVAL_S = 1
DATA_VERSION = "dagster/data_version"


def copy_farm(dest: Path) -> Path:
    shutil.copytree(FARM, dest)
    place_busybox(dest)
    return dest / "bake.hcl"


@contextmanager
def farm_instance(
    tmp_path: Path,
    builders: Builders,
    registry: RegistryServer,
    bake_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[dg.DagsterInstance, WorkspaceProcessContext]]:
    """The instance with the placement coordinator and real launcher, and the daemon's workspace
    (its code server and run workers inherit this process's environment)."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n"
        + "".join(
            f"  - {{name: {n}, builder: {n}, cores: 8, mem_gb: 16, link_mbps: 1000}}\n"
            for n in NODES
        )
        + "target_costs:\n  reference: {cores: 8, mem_gb: 16}\n"
    )
    for key in [k for k in os.environ if k.startswith("ROCM_")]:
        monkeypatch.delenv(key)
    for key in ("DOCKER_HOST", "DOCKER_CONTEXT", "PUBLISHED_INPUTS", "GPU_ARCH", "RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in builders.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ROCM_BAKE_FILE", str(bake_file))
    monkeypatch.setenv("ROCM_FLEET_FILE", str(fleet))
    monkeypatch.setenv("ROCM_REGISTRY_URL", registry.url)
    monkeypatch.setenv("REGISTRY", registry.host)
    monkeypatch.setenv("NAMESPACE", registry.new_repo("auto"))
    monkeypatch.setenv("HOLD_S", "0")
    monkeypatch.setenv("ROCM_AUTOMATION_INTERVAL_S", str(INTERVAL_S))
    home = tmp_path / "dagster-home"
    home.mkdir()
    overrides = {
        "run_coordinator": {
            "module": "rocm_assets.instance.coordinator",
            "class": "PlacementRunCoordinator",
            "config": {"bake_file": str(bake_file), "fleet_file": str(fleet), "probe_nodes": False},
        },
        "run_launcher": {"module": "dagster", "class": "DefaultRunLauncher"},
        "telemetry": {"enabled": False},
    }
    target = ModuleTarget(
        module_name="rocm_assets.definitions",
        attribute=None,
        working_directory=str(PROJECT_ROOT),
        location_name=LOCATION,
    )
    with instance_for_test(temp_dir=str(home), overrides=overrides) as instance:
        with create_test_daemon_workspace_context(target, instance) as workspace:
            yield instance, workspace


def built(run: dg.DagsterRun) -> set[tuple[str, str | None]]:
    keys = run.asset_selection or frozenset()
    return {(k.to_user_string(), run.tags.get("dagster/partition")) for k in keys}


class Daemons:
    """The sensor daemon's and the queued-run daemon's iterations, driven until the farm rests."""

    def __init__(self, instance: dg.DagsterInstance, workspace: WorkspaceProcessContext) -> None:
        self.instance = instance
        self.workspace = workspace
        self.logger = logging.getLogger("test-automation")

    def runs(self) -> dict[str, dg.DagsterRun]:
        return {r.run_id: r for r in self.instance.get_runs()}

    def tick(self) -> list[dg.DagsterRun]:
        """One evaluation of the automation sensor; the runs it requested."""
        before = set(self.runs())
        time.sleep(INTERVAL_S + 0.2)  # the sensor's minimum interval
        list(execute_sensor_iteration(self.workspace, self.logger, None, None))
        ticks = self.instance.get_ticks(self._sensor_origin_id(), self._selector_id(), limit=1)
        assert ticks and ticks[0].status != TickStatus.FAILURE, ticks and ticks[0].error
        return [r for rid, r in self.runs().items() if rid not in before]

    def _sensor(self) -> RemoteSensor:
        location = self.workspace.create_request_context().get_code_location(LOCATION)
        return next(
            s for repo in location.get_repositories().values()
            for s in repo.get_sensors() if s.name == SENSOR_NAME
        )  # fmt: skip

    def _sensor_origin_id(self) -> str:
        return self._sensor().get_remote_origin_id()

    def _selector_id(self) -> str:
        return self._sensor().selector_id

    def settle(self) -> None:
        """Launch what is queued, as placement allows, until every run has ended."""
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(self.workspace))
            unfinished = [r for r in self.runs().values() if not r.is_finished]
            if not unfinished:
                return
            assert time.monotonic() < deadline, f"runs still going: {unfinished}"
            time.sleep(0.5)

    def until_rest(self) -> list[set[tuple[str, str | None]]]:
        """Tick, build, tick ... until a tick requests nothing; what each tick requested."""
        waves = []
        for _ in range(10):
            runs = self.tick()
            if not runs:
                return waves
            self.settle()
            failed = [r for r in self.runs().values() if r.status != dg.DagsterRunStatus.SUCCESS]
            assert not failed, [(r.run_id, r.status, built(r)) for r in failed]
            waves.append(set().union(*(built(r) for r in runs)))
        raise AssertionError(f"the automation never rested: {waves}")


def stale_cli(home: Path) -> dict:
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-m", "rocm_assets.cli", "stale", "--json"],
        env=env, capture_output=True, text=True, check=False, cwd=PROJECT_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {
        (row["target"], row["partition"]): row["reasons"]
        for row in json.loads(done.stdout)["rebuild"]
    }


@pytest.fixture
def two_builders(dockerd: Dockerd, tmp_path: Path) -> Builders:
    """Two builders (the fleet's nodes) on the session's engine."""
    return make_builders(tmp_path / "docker-config", dict.fromkeys(NODES, dockerd))


def history_names(builders: Builders, instance: dg.DagsterInstance) -> list[str]:
    """Every build this instance's runs made on the engine (both builders are that one engine,
    so one lists them all; other tests' builds on the session's engine are left out)."""
    runs = {r.run_id for r in instance.get_runs()}
    return sorted(
        r.name
        for r in builders.history(NODES[0], "rocm-pytorch-build/")
        if r.name.rsplit("/", 1)[-1] in runs
    )


def test_a_pin_bump_rebuilds_exactly_its_target_and_dependents_across_arches(
    two_builders: Builders,
    registry_server: RegistryServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bake_file = copy_farm(tmp_path / "farm")
    with farm_instance(tmp_path, two_builders, registry_server, bake_file, monkeypatch) as (
        instance,
        workspace,
    ):
        daemons = Daemons(instance, workspace)
        # Nothing built: everything is missing, and requested inputs first.
        first = daemons.until_rest()
        assert set().union(*first) == EVERY_BUILD
        assert first[0] == {("runtime", a) for a in ARCHES} | {("src", None)}
        assert stale_cli(Path(instance.root_directory)) == {}
        builds = len(history_names(two_builders, instance))
        assert builds == len(EVERY_BUILD)

        # A comment and blank lines in the bake file: no code version moves, nothing is asked.
        versions = {t: d.version for t, d in definitions(load_graph(bake_file, {})).items()}
        bake_file.write_text(f"# an operator's note\n\n{bake_file.read_text()}\n\n")
        assert {t: d.version for t, d in definitions(load_graph(bake_file, {})).items()} == versions
        workspace.reload_code_location(LOCATION)
        assert daemons.until_rest() == []
        assert len(history_names(two_builders, instance)) == builds

        # The pin bump: src's code version changes, and only src's.
        bake_file.write_text(
            bake_file.read_text().replace(
                'variable "SDE_SRC_REF" {\n  default = "v1"',
                'variable "SDE_SRC_REF" {\n  default = "v2"',
            )
        )
        bumped = {t: d.version for t, d in definitions(load_graph(bake_file, {})).items()}
        assert {t for t in bumped if bumped[t] != versions[t]} == {"src"}
        workspace.reload_code_location(LOCATION)
        home = Path(instance.root_directory)
        assert stale_cli(home) == {
            ("src", None): ["code version changed: args SRC_REF"],
            **{("torch", a): ["after input src"] for a in ARCHES},
            **{("torch-wheel", a): [f"after input torch {a}"] for a in ARCHES},
        }
        waves = daemons.until_rest()
        assert waves == [
            {("src", None)},
            {("torch", a) for a in ARCHES},
            {("torch-wheel", a) for a in ARCHES},
        ]
        assert stale_cli(home) == {}
        # BuildKit saw exactly five more builds, none of runtime or base.
        names = history_names(two_builders, instance)
        assert len(names) == builds + 5
        assert sum(n.startswith(("rocm-pytorch-build/runtime/", "rocm-pytorch-build/base/"))
                   for n in names) == 4  # fmt: skip


def test_the_sensor_is_on_by_default_and_groups_can_be_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rocm_assets.defs.automation import build_automation_sensor

    graph = load_graph(FARM / "bake.hcl", {})
    sensor = build_automation_sensor(graph, {})
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert build_automation_sensor(graph, {"ROCM_AUTOMATION": "off"}).default_status == (
        dg.DefaultSensorStatus.STOPPED
    )
    wheels_off = build_automation_sensor(graph, {"ROCM_AUTOMATION_OFF_GROUPS": "wheels"})
    asset_graph = AssetGraph.from_assets(build_bake_assets(graph))
    selected = wheels_off.asset_selection.resolve(asset_graph)
    assert {k.to_user_string() for k in selected} == {"runtime", "base", "src", "torch"}
    with pytest.raises(ValueError, match="ROCM_AUTOMATION_OFF_GROUPS: no bake group 'whels'"):
        build_automation_sensor(graph, {"ROCM_AUTOMATION_OFF_GROUPS": "whels"})


def test_code_versions_follow_the_definition_only(tmp_path: Path) -> None:
    bake_file = copy_farm(tmp_path / "farm")
    base = {t: d.version for t, d in definitions(load_graph(bake_file, {})).items()}
    # An env pin changes its target's version; a per-run setting changes none.
    pinned = definitions(load_graph(bake_file, {"SDE_SRC_REF": "v9"}))
    assert {t for t, d in pinned.items() if d.version != base[t]} == {"src"}
    per_run = definitions(load_graph(bake_file, {"RUN_ID": "x", "MAX_JOBS": "3"}))
    assert {t: d.version for t, d in per_run.items()} == base
    # A context file the Dockerfile copies changes that target only; one it does not read, none.
    (bake_file.parent / "files" / "torch.txt").write_text("new torch\n")
    (bake_file.parent / "files" / "unused.txt").write_text("read by nobody\n")
    edited = definitions(load_graph(bake_file, {}))
    assert {t for t, d in edited.items() if d.version != base[t]} == {"torch"}
    # ... unless .dockerignore leaves it out of the context.
    (bake_file.parent / ".dockerignore").write_text("files/torch.txt\n")
    ignored = definitions(load_graph(bake_file, {}))
    assert "files/torch.txt" not in ignored["torch"].files
    # A new arch is new partitions, not a new version.
    text = bake_file.read_text().replace('["gfx942", "gfx1100"]', '["gfx942", "gfx1100", "gfx950"]')
    bake_file.write_text(text)
    (bake_file.parent / ".dockerignore").unlink()
    wider = load_graph(bake_file, {})
    assert wider.arches == ("gfx942", "gfx1100", "gfx950")
    assert {t: d.version for t, d in definitions(wider).items()} == {
        t: d.version for t, d in edited.items()
    }


def test_stale_names_a_push_outside_dagster_and_needs_an_instance(tmp_path: Path) -> None:
    bake_file = copy_farm(tmp_path / "farm")
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "ROCM_BAKE_FILE": str(bake_file)}
    env.pop("DAGSTER_HOME", None)
    cli = [sys.executable, "-m", "rocm_assets.cli", "stale"]
    # No DAGSTER_HOME and no ./.dagster_home in the directory it runs in: one line, the remedy.
    done = subprocess.run(cli, env=env, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("rocm-assets: error: DAGSTER_HOME is not set")
    assert done.stderr.count("\n") == 1 and "the directory `make dev` runs in" in done.stderr
    with instance_for_test(temp_dir=str(home)) as instance:
        # runtime gfx942 built as sha256:a, then the registry's tag seen holding sha256:b.
        instance.report_runless_asset_event(
            dg.AssetMaterialization("runtime", partition="gfx942", tags={DATA_VERSION: "sha256:a"})
        )
        instance.report_runless_asset_event(
            dg.AssetObservation("runtime", partition="gfx942", tags={DATA_VERSION: "sha256:b"})
        )
    done = subprocess.run(
        [*cli, "--json"], env={**env, "DAGSTER_HOME": str(home)}, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = {(r["target"], r["partition"]): r for r in report["rebuild"]}
    assert report["checked"] == len(EVERY_BUILD)
    assert rows[("runtime", "gfx942")]["reasons"] == [
        "registry holds sha256:b, pushed outside Dagster"
    ]
    assert rows[("base", "gfx942")]["reasons"] == ["missing", "after input runtime gfx942"]
    assert rows[("runtime", "gfx1100")]["reasons"] == ["missing"]
    assert len(rows) == len(EVERY_BUILD)


def test_stale_without_dagster_home_reads_the_instance_make_dev_runs(tmp_path: Path) -> None:
    # `make dev`'s instance: ./.dagster_home holding the shipped dagster.yaml, DAGSTER_HOME set
    # only in make's shell, and `stale` run from the same directory in a second shell.
    bake_file = copy_farm(tmp_path / "farm")
    home = tmp_path / ".dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.report_runless_asset_event(
            dg.AssetMaterialization("runtime", partition="gfx942", tags={DATA_VERSION: "sha256:a"})
        )
        instance.report_runless_asset_event(
            dg.AssetObservation("runtime", partition="gfx942", tags={DATA_VERSION: "sha256:b"})
        )
    env = {**os.environ, "ROCM_BAKE_FILE": str(bake_file)}
    env.pop("DAGSTER_HOME", None)
    done = subprocess.run(
        [sys.executable, "-m", "rocm_assets.cli", "stale", "--json"],
        env=env, capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"rocm-assets: read the Dagster instance at {home} (DAGSTER_HOME is unset)\n"
    )
    # What that instance holds, not an empty one's "missing".
    rows = {(r["target"], r["partition"]): r for r in json.loads(done.stdout)["rebuild"]}
    assert rows[("runtime", "gfx942")]["reasons"] == [
        "registry holds sha256:b, pushed outside Dagster"
    ]


def test_a_vllm_pin_bump_redefines_exactly_the_two_vllm_targets(tmp_path: Path) -> None:
    # The shipped bake file, resolved by the installed buildx (bake --print), and its Dockerfiles.
    shipped = PROJECT_ROOT / "rocm-bake.hcl"
    base = {t: d.version for t, d in definitions(load_graph(shipped, {})).items()}
    bumped = definitions(load_graph(shipped, {"SDE_VLLM_REF": "v0.99.0"}))
    assert {t for t, d in bumped.items() if d.version != base[t]} == {"vllm", "vllm-wheel"}
    # A comment and blank lines, in a copy beside a copy of the Dockerfiles: nothing moves.
    shutil.copytree(PROJECT_ROOT / "docker", tmp_path / "docker")
    copy = tmp_path / shipped.name
    copy.write_text(f"# a note\n\n{shipped.read_text()}\n\n")
    assert {t: d.version for t, d in definitions(load_graph(copy, {})).items()} == base
    # A sixth arch: new partitions, no new code version.
    copy.write_text(shipped.read_text().replace('"gfx1250"]', '"gfx1250", "gfx1151"]', 1))
    wider = load_graph(copy, {})
    assert "gfx1151" in wider.arches
    assert {t: d.version for t, d in definitions(wider).items()} == base
