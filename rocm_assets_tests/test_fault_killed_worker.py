"""Issue 29, fault 1: a run worker killed with SIGKILL mid-bake.

What must hold: the build is cancelled on its node (BuildKit's record ends cancelled), no bake
process and no scratch directory of it is left, the run fails with one line saying its worker
died, and the node's builder is handed to the next build only once BuildKit shows no running
build of the dead run: never two builds on one node, as the node's own history shows.

Real, all of it: a SQLite Dagster instance with rocm-assets' coordinator, the queued-run daemon's
own iteration (the coordinator's placement tick and its drain of ended runs' builders), Dagster's
DefaultRunLauncher and a gRPC code server of `rocm_assets.definitions` whose run worker is the
process killed, the bake guard, Debian's buildx 0.29 on dockerd 26 (a docker context is the
node's builder) and its BuildKit history, and Debian's docker-registry the builds push to. The
e2e farm's builds hold their node HOLD_S seconds (a busybox sleep); `quick` is base again, held
1 s, so the build that takes the node next ends soon.
"""

import logging
import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.test_utils import instance_for_test
from dagster._daemon.monitoring.concurrency import execute_concurrency_slots_iteration

from rocm_assets.core.build.invocation import build_name
from rocm_assets.core.common.constants import ROCM_BUILDER_TAG, ROCM_FAILURE_TAG, ROCM_NODE_TAG
from rocm_assets.instance import claims
from rocm_assets_tests.helpers import alive, wait_until
from rocm_assets_tests.helpers.instance import coordinator_config, end, iterate, messages, submit
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
from rocm_assets_tests.servers.dockerd import E2E_BUILDER, Builders, copy_e2e, record_span
from rocm_assets_tests.servers.registry import RegistryServer

NODE = "node-a"
ARCH = "gfx942"
# Far longer than the test lets the killed build run.
HOLD_S = "120"
QUICK_HCL = """
target "quick" {
  inherits = ["base"]
  tags     = ["${REGISTRY}/e2e/quick:${GPU_ARCH}"]
  args     = { HOLD_S = "1" }
}
"""
logger = logging.getLogger(__name__)
GUARD_MODULE = b"rocm_assets.core.build.guard"
# What a slow cancel looks like: the guard frozen this long after its worker died.
FROZEN_S = 12.0


def _cmdlines() -> list[tuple[int, list[bytes]]]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                found.append((int(proc.name), (proc / "cmdline").read_bytes().split(b"\0")))
            except OSError:
                continue
    return found


def guard_of(name: str) -> tuple[int, int, Path]:
    """The bake guard of the build named `name`: (its pid, its parent the run worker, the
    build's scratch directory), from its command line."""
    for pid, argv in _cmdlines():
        if GUARD_MODULE in argv and any(name.encode() in a for a in argv):
            worker = int(argv[argv.index(b"--parent") + 1])
            return pid, worker, Path(argv[argv.index(b"--scratch") + 1].decode())
    raise AssertionError(f"no bake guard runs {name}")


def bake_processes(run_id: str) -> list[int]:
    """Live processes baking for this run: the docker CLI and buildx (their argv names it)."""
    marker = run_id.encode()
    return [
        pid
        for pid, argv in _cmdlines()
        if any(b".args.BUILDKIT_BUILD_NAME=" in a and marker in a for a in argv) and alive(pid)
    ]


def farm_for(builders: Builders, registry: RegistryServer, tmp_path: Path) -> QueuedFarm:
    bake_file = copy_e2e(tmp_path / "e2e", extra=QUICK_HCL)
    return make_queued_farm(
        builders, tmp_path, registry, bake_file, {NODE: E2E_BUILDER}, HOLD_S=HOLD_S
    )


def running(builders: Builders, name: str) -> bool:
    return any(r.status == "Running" for r in builders.history(E2E_BUILDER, name))


def freed_at(instance: dg.DagsterInstance, run_id: str) -> float:
    """When the daemon freed the run's builder: its engine event's timestamp."""
    [event] = [e for e in instance.all_logs(run_id) if (e.message or "").startswith("builder ")]
    return event.timestamp


def assert_one_build_at_a_time(builders: Builders, *run_ids: str) -> None:
    names = {r.name for run_id in run_ids for r in run_records(builders, E2E_BUILDER, run_id)}
    assert builders.overlaps(BUILD_PREFIX, names) == []


def test_a_killed_worker_fails_its_run_cancels_its_build_and_frees_its_node_after(
    builders: Builders,
    registry_server: RegistryServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    farm = farm_for(builders, registry_server, tmp_path)
    with placement_instance(farm, monkeypatch) as (instance, workspace):
        killed = submit_build(instance, workspace, "base", ARCH)
        name = build_name("base", ARCH, killed)
        try:
            daemon_until(workspace, lambda: running(builders, name), "the build to start")
            _, worker, scratch = guard_of(name)
            assert scratch.is_dir() and bake_processes(killed)
            # The next build waits for the node the killed one holds.
            after = submit_build(instance, workspace, "quick", ARCH)
            daemon_until(
                workspace, lambda: status(instance, after) == dg.DagsterRunStatus.QUEUED, "queued"
            )
            assert claims.holder(instance, E2E_BUILDER) == killed

            os.kill(worker, signal.SIGKILL)
            killed_at, killed_wall = time.monotonic(), time.time()
            released = daemon_until(
                workspace,
                lambda: claims.holder(instance, E2E_BUILDER) != killed,
                "the node's builder to be freed",
                timeout_s=120,
            )
            logger.info("kill -9 to builder freed: %.1f s", released - killed_at)
            daemon_until(
                workspace,
                lambda: status(instance, after) == dg.DagsterRunStatus.SUCCESS,
                "the next build to finish",
            )
        finally:
            for pid in bake_processes(killed):
                os.kill(pid, signal.SIGKILL)

        run = instance.get_run_by_id(killed)
        assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
        line = f"run worker (pid {worker}) died mid-bake of base {ARCH} on {NODE}: killed by signal 9 (SIGKILL)"
        assert run.tags[ROCM_FAILURE_TAG] == line
        log = run_log(instance, killed)
        assert (
            f"{line}; builder {E2E_BUILDER} stays claimed until BuildKit shows the bake ended"
            in log
        )
        # The builder went to the next build only after BuildKit had ended the killed one.
        [record] = run_records(builders, E2E_BUILDER, killed)
        _, ended = record_span(record)
        assert ended <= datetime.fromtimestamp(freed_at(instance, killed), UTC)
        logger.info(
            "BuildKit ended the killed build %.1f s after the kill", ended.timestamp() - killed_wall
        )
        [next_record] = run_records(builders, E2E_BUILDER, after)
        assert record_span(next_record)[0] >= ended
        assert next_record.status == "Completed"
        assert farm.registry.digest(f"{farm.registry_var}/e2e/quick:{ARCH}") is not None

    # BuildKit ended the killed build as cancelled; nothing of its bake is left on this host.
    assert builders.status(E2E_BUILDER, name) == "canceled"
    assert bake_processes(killed) == []
    assert not scratch.exists()
    assert_one_build_at_a_time(builders, killed, after)


def test_the_node_stays_claimed_while_a_dead_workers_build_is_still_cancelling(
    builders: Builders,
    registry_server: RegistryServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    farm = farm_for(builders, registry_server, tmp_path)
    with placement_instance(farm, monkeypatch) as (instance, workspace):
        killed = submit_build(instance, workspace, "base", ARCH)
        name = build_name("base", ARCH, killed)
        guard = None
        try:
            daemon_until(workspace, lambda: running(builders, name), "the build to start")
            guard, worker, _ = guard_of(name)
            after = submit_build(instance, workspace, "quick", ARCH)
            # A slow cancel: the guard is frozen when its worker dies, so bake goes on building.
            os.kill(guard, signal.SIGSTOP)
            os.kill(worker, signal.SIGKILL)
            daemon_until(
                workspace,
                lambda: status(instance, killed) == dg.DagsterRunStatus.FAILURE,
                "Dagster to fail the run",
            )
            frozen_until = time.monotonic() + FROZEN_S
            while time.monotonic() < frozen_until:
                daemon_until(workspace, lambda: True, "an iteration")
                assert running(builders, name)
                # The run has ended, but its build runs: the node is not handed on.
                assert claims.holder(instance, E2E_BUILDER) == killed
                assert status(instance, after) == dg.DagsterRunStatus.QUEUED
                time.sleep(1.0)
            os.kill(guard, signal.SIGCONT)
            daemon_until(
                workspace,
                lambda: status(instance, after) == dg.DagsterRunStatus.SUCCESS,
                "the next build to finish",
            )
        finally:
            if guard is not None and alive(guard):
                os.kill(guard, signal.SIGCONT)
            for pid in bake_processes(killed):
                os.kill(pid, signal.SIGKILL)
        [record] = run_records(builders, E2E_BUILDER, killed)
        _, ended = record_span(record)
        assert ended <= datetime.fromtimestamp(freed_at(instance, killed), UTC)

    wait_until(lambda: builders.status(E2E_BUILDER, name) == "canceled", "the cancel", 60)
    assert_one_build_at_a_time(builders, killed, after)


def test_a_builder_whose_history_cannot_be_read_is_freed_after_the_bound(
    fleet_file: Path,
) -> None:
    # The fleet's builders are no docker contexts: `docker buildx history ls` on them fails.
    overrides = {
        **coordinator_config(fleet_file, bake_end_wait_seconds=2),
        "run_monitoring": {"enabled": True, "free_slots_after_run_end_seconds": 1},
    }
    with instance_for_test(overrides=overrides) as instance:
        run = submit(instance, "rocm-runtime", "gfx942")
        iterate(instance)
        placed = instance.get_run_by_id(run.run_id)
        assert placed is not None
        builder = placed.tags[ROCM_BUILDER_TAG]
        # Its worker started (this process plays it), then died: Dagster failed the run.
        instance.report_dagster_event(
            DagsterEvent(
                DagsterEventType.RUN_START.value, job_name=placed.job_name, pid=os.getpid()
            ),
            run_id=run.run_id,
        )
        end(instance, placed, DagsterEventType.RUN_FAILURE)
        iterate(instance)
        failed = instance.get_run_by_id(run.run_id)
        assert failed is not None
        line = (
            f"run worker (pid {os.getpid()}) died mid-bake of rocm-runtime gfx942 on "
            f"{placed.tags[ROCM_NODE_TAG]}: the run failed: done"
        )
        assert failed.tags[ROCM_FAILURE_TAG] == line
        assert claims.holder(instance, builder) == run.run_id
        # Dagster's own sweep of ended runs' slots leaves the held builder alone.
        time.sleep(1.5)
        context = SimpleNamespace(instance=instance)
        list(execute_concurrency_slots_iteration(context, logger))  # type: ignore[arg-type]
        assert claims.holder(instance, builder) == run.run_id
        wait_until(
            lambda: (iterate(instance), claims.holder(instance, builder) is None)[1],
            "the bound to pass",
            timeout_s=30,
        )
        freed = [m for m in messages(instance, run.run_id).splitlines() if m.startswith("builder")]
        assert len(freed) == 1
        assert freed[0] == (
            f"builder {builder} freed: 2s after the run ended, though docker buildx history ls "
            f'--builder {builder} failed: ERROR: no builder "{builder}" found'
        )


def test_a_run_its_worker_failed_itself_frees_its_builder_at_once(fleet_file: Path) -> None:
    # A worker that ends its run itself (a preflight that found an input missing, a failed
    # bake) stopped any bake of it first: nothing to wait for, nobody died.
    with instance_for_test(overrides=coordinator_config(fleet_file)) as instance:
        run = submit(instance, "rocm-runtime", "gfx942")
        iterate(instance)
        placed = instance.get_run_by_id(run.run_id)
        assert placed is not None
        builder = placed.tags[ROCM_BUILDER_TAG]
        for kind in (DagsterEventType.RUN_START, DagsterEventType.RUN_FAILURE):
            instance.report_dagster_event(
                DagsterEvent(kind.value, job_name=placed.job_name, pid=os.getpid()),
                run_id=run.run_id,
            )
        iterate(instance)
        assert claims.holder(instance, builder) is None
        failed = instance.get_run_by_id(run.run_id)
        assert failed is not None and ROCM_FAILURE_TAG not in failed.tags
        assert "died" not in messages(instance, run.run_id)
