"""A node taken out of fleet.yaml while its build runs, then put back.

Issue 29's item 5. The farm as deployed (rocm_assets_tests/helpers/daemon_farm.py): rocm-assets'
placement coordinator, the real `dagster-daemon run` (whose tick re-reads fleet.yaml when it
changes), and a code server of its own whose run workers bake for real on two builders, each a
docker context of an engine of its own. Two requests of the e2e farm's default group (one per
arch, fanned out into one run per build), every build holding its node HOLD_S seconds.

With both machines building, n-b2 is deleted from fleet.yaml, as an operator takes a machine out
for maintenance. Its build runs to its end and is recorded; while n-b2 is out, everything is
placed on n-b1 and BuildKit on n-b2 gets no new record. Put back, n-b2 takes builds again.
Asserted besides: every run succeeded, each build baked once, no builder claim is left, no two
records overlapped on one engine, and the daemon logged no traceback.
"""

import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest

from rocm_assets.core.common.constants import ROCM_BUILDER_TAG
from rocm_assets_tests.helpers import wait_until
from rocm_assets_tests.helpers.daemon_farm import (
    BUILD_PREFIX,
    assert_each_success_baked_once,
    assert_nothing_held,
    build_runs,
    history_name,
    make_daemon_farm,
    placement,
    running_farm,
    submit,
    wait_for_runs,
)
from rocm_assets_tests.servers.dockerd import E2E_BAKE_FILE, EnginePool, make_builders, record_span
from rocm_assets_tests.servers.registry import RegistryServer

pytestmark = [pytest.mark.real, pytest.mark.slow]

NODES = {"n-b1": "b1", "n-b2": "b2"}
ARCHES = ("gfx942", "gfx1100")
BUILDS = 4 * len(ARCHES)
HOLD_S = 8
# How long n-b2 stays out after its last build ended: a few placements on n-b1 meanwhile.
OUT_S = 20.0
GUARD_S = 900.0


def test_a_node_out_of_the_fleet_finishes_its_build_and_gets_none_until_it_is_back(
    tmp_path: Path,
    registry_server: RegistryServer,
    engines: EnginePool,
    e2e_context: Path,
    record_property: Callable[[str, object], None],
) -> None:
    builders = make_builders(
        tmp_path / "docker-config", {b: engines.get(i) for i, b in enumerate(NODES.values())}
    )
    farm = make_daemon_farm(
        tmp_path / "farm", builders, registry_server, E2E_BAKE_FILE, NODES, HOLD_S=str(HOLD_S)
    )
    with running_farm(farm) as (instance, workspace):
        for arch in ARCHES:
            submit(instance, workspace, "default", partition=arch)

        def both_machines_build() -> bool:
            return len(build_runs(instance)) == BUILDS and all(
                any(r.status == "Running" for r in builders.history(b, BUILD_PREFIX))
                for b in NODES.values()
            )

        wait_until(both_machines_build, f"both machines building\n{farm.logs_tail()}", GUARD_S)
        [on_b2] = [
            r
            for r in build_runs(instance)
            if r.status == dg.DagsterRunStatus.STARTED and r.tags[ROCM_BUILDER_TAG] == "b2"
        ]
        farm.set_nodes({"n-b1": "b1"})
        removed = time.time()

        # Its build runs to its end, recorded, its claim freed; then n-b2 stays out OUT_S.
        wait_until(
            lambda: instance.get_run_by_id(on_b2.run_id).is_finished, "n-b2's build", GUARD_S
        )
        assert instance.get_run_by_id(on_b2.run_id).status == dg.DagsterRunStatus.SUCCESS
        time.sleep(OUT_S)
        out = builders.history("b2", BUILD_PREFIX)
        assert [r.name for r in out if record_span(r)[0].timestamp() > removed] == []
        placed_while_out = [
            p
            for r in build_runs(instance)
            if (p := placement(instance, r.run_id)) and p[0] > removed
        ]
        assert placed_while_out and {node for _, node in placed_while_out} == {"n-b1"}

        farm.set_nodes(NODES)
        added = time.time()
        took_s = wait_for_runs(instance, farm, BUILDS, GUARD_S)
        runs = build_runs(instance)
        failed = {
            r.run_id[:8]: r.status.value for r in runs if r.status != dg.DagsterRunStatus.SUCCESS
        }
        assert failed == {}, farm.logs_tail()
        assert_nothing_held(instance)
        assert_each_success_baked_once(farm, runs, list(NODES.values()))
        back = sorted(
            at
            for r in runs
            if (p := placement(instance, r.run_id)) and p[1] == "n-b2" and (at := p[0]) > added
        )
        assert back, "n-b2 took no build once it was back"
    assert builders.overlaps(BUILD_PREFIX, {history_name(r) for r in runs}) == []
    assert "Traceback" not in farm.log("daemon"), farm.log("daemon")[-3000:]
    record_property("back_in_use_after_s", round(back[0] - added, 1))
    record_property("all_ended_after_put_back_s", round(took_s, 1))
    record_property("placed_on_n_b1_while_out", len(placed_while_out))
