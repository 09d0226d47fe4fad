"""Issue 29, fault 3: the registry goes away, and a build's input fails.

What must hold: a registry outage shorter than the stated bound (REGISTRY_OUTAGE_BOUND_S, 2 min)
loses no build: each bake the registry failed is retried until it pushes, and every build ends
pushed, its digest in the registry; a registry that stays away fails the build after the retries
with one line that says so. A build whose input failed does not queue behind it: it fails on the
daemon's next tick, naming the input and its run. Never two builds on one node, as the nodes' own
BuildKit history shows.

Real, all of it: Debian's docker-registry (stopped, and started again on its port with its
storage), Debian's buildx 0.29 and dockerd 26 (two engines, one per node, each reached through
the docker context that is its builder) with their BuildKit history, and for the farm tests a
SQLite Dagster instance with rocm-assets' coordinator, the queued-run daemon's own iteration,
Dagster's DefaultRunLauncher and a gRPC code server of `rocm_assets.definitions` whose run workers
bake. The e2e farm's builds hold their node HOLD_S seconds (a busybox sleep), so the outage lands
while they build; FAIL=1 makes tool-wheel's build fail.
"""

import logging
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest

from rocm_assets.core.bake import load_graph
from rocm_assets.core.build.invocation import (
    BuildError,
    bake_invocation,
    build_name,
    registry_trouble,
    run_bake,
)
from rocm_assets.core.registry.client import RegistryClient, RegistryError
from rocm_assets_tests.helpers import free_port
from rocm_assets_tests.helpers.queued_farm import (
    BUILD_PREFIX,
    QueuedFarm,
    daemon_until,
    make_queued_farm,
    placement_instance,
    run_log,
    run_records,
    status,
    submit_build,
)
from rocm_assets_tests.servers.dockerd import (
    E2E_BAKE_FILE,
    E2E_BUILDER,
    Builders,
    EnginePool,
    bake_push,
    make_builders,
    record_span,
)
from rocm_assets_tests.servers.hostile_registry import HostileRegistry, Scripted
from rocm_assets_tests.servers.registry import RegistryServer, start_docker_registry

logger = logging.getLogger(__name__)
ARCH = "gfx942"
TARGETS = ("base", "tool-wheel", "lib", "app-wheel")
NOARCH_TARGETS = ("tool-wheel",)
# Long enough for the outage to start while the first two builds hold their nodes.
HOLD_S = "8"
# Just under the bound the farm states.
OUTAGE_S = 100.0
_FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE)


def partition(target: str) -> str | None:
    return None if target in NOARCH_TARGETS else ARCH


def finished(instance: dg.DagsterInstance, run_ids: dict[str, str]) -> bool:
    return all(status(instance, r) in _FINISHED for r in run_ids.values())


def records_by_run(farm: QueuedFarm, run_ids: dict[str, str]) -> dict[str, list]:
    return {
        t: [r for b in farm.nodes.values() for r in run_records(farm.builders, b, run_id)]
        for t, run_id in run_ids.items()
    }


def assert_one_build_at_a_time(farm: QueuedFarm, run_ids: dict[str, str]) -> None:
    names = {r.name for records in records_by_run(farm, run_ids).values() for r in records}
    assert farm.builders.overlaps(BUILD_PREFIX, names) == []


# ##### WHAT COUNTS AS THE REGISTRY'S FAULT


@pytest.mark.parametrize(
    ("last_line", "registry"),
    [
        # The docker engine pushing to a registry that is down (seen here, buildx 0.29).
        (
            'ERROR: Get "http://127.0.0.1:4/v2/": dial tcp 127.0.0.1:4: connect: connection refused',
            True,
        ),
        # The docker engine's push, the registry answering 5xx to every upload (seen here).
        ("ERROR: received unexpected HTTP status: 503 Service Unavailable", True),
        ("ERROR: received unexpected HTTP status: 502 Bad Gateway", True),
        # BuildKit's own pusher and resolver (docker-container and remote drivers).
        (
            "ERROR: failed to solve: failed to push r:5000/x:1: unexpected status from PUT "
            "request to http://r:5000/v2/x/manifests/1: 500 Internal Server Error",
            True,
        ),
        (
            "ERROR: failed to solve: r:5000/x:1: failed to resolve source metadata for "
            'r:5000/x:1: failed to do request: Head "http://r:5000/v2/x/manifests/1": dial tcp: '
            "lookup r: no such host",
            True,
        ),
        # A client error is no outage: retrying would give the same answer.
        ("ERROR: received unexpected HTTP status: 401 Unauthorized", False),
        # A step that failed, even one whose own output spoke of the network.
        (
            'ERROR: failed to solve: process "/bin/sh -c curl http://x || echo connection '
            'refused" did not complete successfully: exit code: 1',
            False,
        ),
    ],
)
def test_the_registry_is_blamed_only_for_network_errors_and_5xx(
    last_line: str, registry: bool
) -> None:
    output = ("#9 pushing r:5000/x:1 with docker", last_line)
    assert (registry_trouble(output) == last_line) is registry


@pytest.mark.parametrize(
    ("reply", "transient"),
    [
        (Scripted(status=503, reason="Service Unavailable"), True),
        (Scripted(status=500, reason="Internal Server Error"), True),
        (Scripted(status=429, reason="Too Many Requests"), True),
        (Scripted(status=401, reason="Unauthorized"), False),
        (Scripted(status=400, reason="Bad Request"), False),
    ],
)
def test_a_registry_error_says_whether_asking_again_may_help(
    hostile_registry: HostileRegistry, reply: Scripted, transient: bool
) -> None:
    hostile_registry.script([reply])
    with RegistryClient(hostile_registry.url, retries=0) as client:
        with pytest.raises(RegistryError) as failed:
            client.digest("e2e/base", ARCH)
    assert failed.value.transient is transient
    # Nobody listening at all: the registry is away.
    with RegistryClient(f"http://127.0.0.1:{free_port()}", retries=0) as client:
        with pytest.raises(RegistryError) as away:
            client.digest("e2e/base", ARCH)
    assert away.value.transient


def test_a_registry_that_stays_away_fails_the_build_after_its_retries(
    builders: Builders, e2e_context: Path, tmp_path: Path
) -> None:
    run_id = f"away-{uuid.uuid4().hex[:12]}"
    # Nothing listens on the port: every push is refused.
    env = {**builders.env, "REGISTRY": f"127.0.0.1:{free_port()}/away", "HOLD_S": "0"}
    inv = bake_invocation(
        bake_file=E2E_BAKE_FILE,
        target="base",
        arch=ARCH,
        partition=ARCH,
        builder=E2E_BUILDER,
        max_jobs=2,
        run_id=run_id,
        metadata_file=tmp_path / "metadata.json",
        base_env=env,
    )
    said: list[str] = []
    with pytest.raises(BuildError) as failed:
        run_bake(inv, on_output=lambda _: None, on_retry=said.append, retry_s=12)
    message = str(failed.value)
    logger.info("%s", message)
    assert "\n" not in message
    assert message.startswith(
        f"bake of base for {ARCH} on builder {E2E_BUILDER} failed (exit 1): ERROR: "
    )
    assert "connection refused; 2 attempts over " in message
    assert "after the registry first failed it; history ref " in message
    assert len(said) == 1 and said[0].startswith("the registry failed bake of base (ERROR: ")
    assert said[0].endswith("); attempt 2 in 5s, retried for 12s after the first failure")
    # Two bakes, one after the other: the docker driver pushes after BuildKit's solve, so each
    # record says the build completed and bake's exit says the push failed.
    records = builders.history(E2E_BUILDER, build_name("base", ARCH, run_id))
    assert [r.status for r in records] == ["Completed", "Completed"]
    assert builders.overlaps(BUILD_PREFIX, {r.name for r in records}) == []


# ##### THE FARM THROUGH AN OUTAGE


@pytest.fixture
def two_nodes(engines: EnginePool, e2e_context: Path, tmp_path: Path) -> Builders:
    """Two builders, each a docker context of an engine of its own: two machines."""
    return make_builders(tmp_path / "docker-config", {"b1": engines.get(0), "b2": engines.get(1)})


@pytest.mark.slow
def test_a_registry_outage_under_the_bound_loses_no_build(
    two_nodes: Builders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A registry of this test's own: it is stopped and started again.
    registry = start_docker_registry(tmp_path / "registry")
    try:
        farm = make_queued_farm(
            two_nodes, tmp_path, registry, E2E_BAKE_FILE, {"n1": "b1", "n2": "b2"}, HOLD_S=HOLD_S
        )
        with placement_instance(farm, monkeypatch) as (instance, workspace):
            run_ids = {t: submit_build(instance, workspace, t, partition(t)) for t in TARGETS}
            roots = {t: run_ids[t] for t in ("base", "tool-wheel")}

            def both_building() -> bool:
                found = records_by_run(farm, roots).values()
                return all(any(r.status == "Running" for r in records) for records in found)

            daemon_until(workspace, both_building, "both roots to build, one on each node")
            registry.stop()
            stopped = time.monotonic()
            daemon_until(
                workspace, lambda: time.monotonic() - stopped >= OUTAGE_S, "the outage to last"
            )
            registry.restart()
            back, back_at = time.monotonic(), time.time()
            logger.info("registry away %.0f s", back - stopped)
            daemon_until(workspace, lambda: finished(instance, run_ids), "every build to end")
            logger.info(
                "every build pushed %.0f s after the registry came back", time.monotonic() - back
            )

            for run_id in run_ids.values():
                assert status(instance, run_id) == dg.DagsterRunStatus.SUCCESS, run_log(
                    instance, run_id
                )
            # Each build is in the registry, as its materialization says.
            graph = load_graph(E2E_BAKE_FILE, {**farm.env, "GPU_ARCH": ARCH})
            for target, run_id in run_ids.items():
                [entry] = instance.all_logs(
                    run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
                )
                materialization = entry.asset_materialization
                assert materialization is not None
                digest = materialization.metadata["digest"].value
                assert registry.digest(graph.tags(target, ARCH)[0]) == digest, target
                if target in roots:
                    logger.info(
                        "%s pushed %.0f s after the registry came back",
                        target,
                        entry.timestamp - back_at,
                    )
            # The roots were built before the outage and pushed after it: their bakes were
            # retried, each retry a line in the run's log and a record on the node; the others
            # baked once.
            records = records_by_run(farm, run_ids)
            for target in TARGETS:
                log = run_log(instance, run_ids[target])
                retries = log.count(f"the registry failed bake of {target} (ERROR: ")
                assert len(records[target]) == retries + 1, target
                assert (retries > 0) == (target in roots), target
                logger.info("%s: %d bakes", target, retries + 1)
            for target in roots:
                assert "connection refused); attempt 2 in 5s" in run_log(instance, run_ids[target])
            assert_one_build_at_a_time(farm, run_ids)
    finally:
        registry.stop()


@pytest.mark.slow
def test_a_build_placed_while_the_registry_is_down_waits_for_it_and_builds(
    builders: Builders, e2e_context: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = start_docker_registry(tmp_path / "registry")
    try:
        farm = make_queued_farm(
            builders, tmp_path, registry, E2E_BAKE_FILE, {"node-a": E2E_BUILDER}, HOLD_S="0"
        )
        # lib's inputs are published, outside Dagster, before the registry goes away.
        bake_push(E2E_BUILDER, E2E_BAKE_FILE, {**farm.env, "GPU_ARCH": ARCH}, "base", "tool-wheel")
        registry.stop()
        stopped = time.monotonic()
        with placement_instance(farm, monkeypatch) as (instance, workspace):
            run_id = submit_build(instance, workspace, "lib", ARCH)
            daemon_until(
                workspace,
                lambda: "preflight could not reach the registry" in run_log(instance, run_id),
                "the run's preflight to find the registry away",
            )
            # Away for 30 s in all, from before the run was submitted.
            time.sleep(max(0.0, 30.0 - (time.monotonic() - stopped)))
            registry.restart()
            back_at = time.time()
            daemon_until(
                workspace,
                lambda: status(instance, run_id) in _FINISHED,
                "the build to end",
            )
            assert status(instance, run_id) == dg.DagsterRunStatus.SUCCESS, run_log(
                instance, run_id
            )
            [entry] = instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
            logger.info("lib pushed %.0f s after the registry came back", entry.timestamp - back_at)
            materialization = entry.asset_materialization
            assert materialization is not None
            graph = load_graph(E2E_BAKE_FILE, {**farm.env, "GPU_ARCH": ARCH})
            digest = materialization.metadata["digest"].value
            assert registry.digest(graph.tags("lib", ARCH)[0]) == digest
            log = run_log(instance, run_id)
            assert "cannot connect for " in log and "attempt 2 in 5s" in log
            # Nothing was built until the preflight passed: one bake, after the registry was back.
            [record] = run_records(builders, E2E_BUILDER, run_id)
            assert record.status == "Completed"
            assert record_span(record)[0].timestamp() >= back_at
            assert builders.overlaps(BUILD_PREFIX, {record.name}) == []
    finally:
        registry.stop()


# ##### A FAILED INPUT


def test_a_dependent_of_a_failed_input_fails_at_once_naming_it(
    builders: Builders,
    registry_server: RegistryServer,
    e2e_context: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    farm = make_queued_farm(
        builders,
        tmp_path,
        registry_server,
        E2E_BAKE_FILE,
        {"node-a": E2E_BUILDER},
        HOLD_S="1",
        FAIL="1",
    )
    with placement_instance(farm, monkeypatch) as (instance, workspace):
        run_ids = {t: submit_build(instance, workspace, t, partition(t)) for t in TARGETS}
        daemon_until(workspace, lambda: finished(instance, run_ids), "every run to end")
        runs = {t: instance.get_run_record_by_id(r) for t, r in run_ids.items()}
        assert {t: r.dagster_run.status for t, r in runs.items() if r} == {
            "base": dg.DagsterRunStatus.SUCCESS,
            "tool-wheel": dg.DagsterRunStatus.FAILURE,
            "lib": dg.DagsterRunStatus.FAILURE,
            "app-wheel": dg.DagsterRunStatus.FAILURE,
        }
        # Each dependent names its failed input, that input's run, and how to build it.
        failed_input = {"lib": ("tool-wheel", "tool-wheel"), "app-wheel": (f"lib@{ARCH}", "lib")}
        command = {
            "lib": "dagster asset materialize -m rocm_assets.definitions --select tool-wheel",
            "app-wheel": "dagster asset materialize -m rocm_assets.definitions --select lib "
            f"--partition {ARCH}",
        }
        for target, (dep, dep_target) in failed_input.items():
            record, dep_record = runs[target], runs[dep_target]
            assert record is not None and dep_record is not None
            [failure] = instance.all_logs(run_ids[target], of_type=dg.DagsterEventType.RUN_FAILURE)
            logger.info("%s", failure.message)
            assert failure.message == (
                f"input {dep} is not published: its last run {run_ids[dep_target][:8]} ended "
                f"FAILURE; build it with: {command[target]}"
            )
            # It never started: no worker, no build on the node.
            assert record.start_time is None
            assert run_records(builders, E2E_BUILDER, run_ids[target]) == []
            # At once: within a daemon iteration or two (1 s apart here) of its input's end.
            assert record.end_time is not None and dep_record.end_time is not None
            waited = record.end_time - dep_record.end_time
            logger.info("%s failed %.1f s after its input %s", target, waited, dep)
            assert waited < 10.0
        assert_one_build_at_a_time(farm, run_ids)
