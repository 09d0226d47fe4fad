"""The daemon SIGKILLed while builds run, then started again as its supervisor would.

Issue 29's item 4. The farm as deployed (rocm_assets_tests/helpers/daemon_farm.py): rocm-assets'
placement coordinator, the real `dagster-daemon run`, and a code server of its own whose run
workers bake for real on two builders, each a docker context of an engine of its own. Two
requests of the e2e farm's default group (one per arch, each fanned out into one run per
build), every build holding its node HOLD_S seconds. With both machines building and the rest
queued, the daemon's process group gets SIGKILL (what `docker kill` or systemd's stop does to
it), stays dead DOWN_S, and a new daemon is started (docker's `restart: unless-stopped`,
systemd's `Restart=always`). On SQLite and on PostgreSQL (the deployed storage).

Asserted: the builds running at the kill finished and were recorded, with one BuildKit record
each (nothing built or pushed twice); the queued ones were placed by the new daemon; every run
succeeded; no builder claim is left; no two records overlapped on one engine; the new daemon
logged no traceback.
"""

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from rocm_assets_tests.helpers import wait_until
from rocm_assets_tests.helpers.daemon_farm import (
    BUILD_PREFIX,
    assert_each_success_baked_once,
    assert_nothing_held,
    build_runs,
    daemon_beat,
    history_name,
    make_daemon_farm,
    placement,
    running_farm,
    stop,
    submit,
    wait_for_runs,
)
from rocm_assets_tests.servers.dockerd import E2E_BAKE_FILE, EnginePool, make_builders
from rocm_assets_tests.servers.registry import RegistryServer

pytestmark = [pytest.mark.real, pytest.mark.slow]

BUILDERS = ("b1", "b2")
ARCHES = ("gfx942", "gfx1100")
BUILDS = 4 * len(ARCHES)
HOLD_S = 12
# A supervisor's restart delay (systemd's RestartSec, the unit's example uses 5 s).
DOWN_S = 5.0
GUARD_S = 900.0


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request: pytest.FixtureRequest) -> dict[str, Any] | None:
    if request.param == "postgres":
        return {"postgres": {"postgres_url": request.getfixturevalue("postgres_db")}}
    return None


def test_killing_the_daemon_mid_build_loses_nothing(
    tmp_path: Path,
    registry_server: RegistryServer,
    engines: EnginePool,
    e2e_context: Path,
    storage: dict[str, Any] | None,
    record_property: Callable[[str, object], None],
) -> None:
    builders = make_builders(
        tmp_path / "docker-config", {b: engines.get(i) for i, b in enumerate(BUILDERS)}
    )
    farm = make_daemon_farm(
        tmp_path / "farm",
        builders,
        registry_server,
        E2E_BAKE_FILE,
        {f"n-{b}": b for b in BUILDERS},
        storage=storage,
        HOLD_S=str(HOLD_S),
    )
    with running_farm(farm) as (instance, workspace):
        for arch in ARCHES:
            submit(instance, workspace, "default", partition=arch)

        def both_machines_build() -> bool:
            return len(build_runs(instance)) == BUILDS and all(
                any(r.status == "Running" for r in builders.history(b, BUILD_PREFIX))
                for b in BUILDERS
            )

        wait_until(both_machines_build, f"both machines building\n{farm.logs_tail()}", GUARD_S)
        building = {
            r.run_id for r in build_runs(instance) if r.status == dg.DagsterRunStatus.STARTED
        }
        queued = {r.run_id for r in build_runs(instance) if r.status == dg.DagsterRunStatus.QUEUED}
        assert len(building) == len(BUILDERS) and queued

        killed = time.time()
        stop(farm.processes["daemon"], signal.SIGKILL)
        time.sleep(DOWN_S)
        # Dead meanwhile: nothing was placed, and the builds ran on.
        assert all(placement(instance, run_id) is None for run_id in queued)
        assert daemon_beat(instance) < killed
        restarted = time.time()
        farm.start_daemon("daemon-restarted")
        wait_until(lambda: daemon_beat(instance) > restarted, "the new daemon's heartbeat", 120)
        beat_s = daemon_beat(instance) - restarted
        took_s = wait_for_runs(instance, farm, BUILDS, GUARD_S)

        runs = build_runs(instance)
        failed = {
            r.run_id[:8]: r.status.value for r in runs if r.status != dg.DagsterRunStatus.SUCCESS
        }
        assert failed == {}, farm.logs_tail()
        assert_nothing_held(instance)
        assert_each_success_baked_once(farm, runs, list(BUILDERS))
        # The builds running at the kill completed across it, each in its one bake.
        for run in runs:
            if run.run_id in building:
                [record] = [
                    r for b in BUILDERS for r in builders.history(b) if r.name == history_name(run)
                ]
                assert record.completed_at is not None
        # The queued ones were placed by the new daemon only.
        placed = [placement(instance, run_id) for run_id in queued]
        assert all(p is not None and p[0] > restarted for p in placed)
        first_placed_s = min(p[0] for p in placed if p is not None) - restarted
    assert builders.overlaps(BUILD_PREFIX, {history_name(r) for r in runs}) == []
    restarted_log = farm.log("daemon-restarted")
    assert "Traceback" not in restarted_log, restarted_log[-3000:]
    record_property("new_daemon_heartbeat_after_s", round(beat_s, 1))
    record_property("first_placement_after_restart_s", round(first_placed_s, 1))
    record_property("all_ended_after_restart_s", round(took_s, 1))
