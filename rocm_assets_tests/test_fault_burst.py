"""A burst of single-build requests: every one placed, never two on a machine, none left behind.

Issue 29's item 8. BURST runs of one asset partition each, submitted at once from several
threads, as a script hammering the UI's Materialize would: ROOTS independent targets for each of
ARCHES GPU arches, each build trivial (HOLD_S=0: a busybox `sleep 0`, then the push). The farm
is as deployed (rocm_assets_tests/helpers/daemon_farm.py): rocm-assets' placement coordinator
with its defaults (the plan follower and CP-SAT in the background), the real `dagster-daemon
run`, a code server of its own whose run workers bake for real, on NODES builders, each a
docker context of an engine of its own (so each is a machine, and BuildKit's history of each
engine says what ran on it). Asserted from the builders' own history: each build baked exactly
once, on the builder its run held, completed, and no two records on one engine overlapped.
"""

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

import dagster as dg
import pytest

from rocm_assets.core.common.constants import ROCM_NODE_TAG
from rocm_assets_tests.helpers.daemon_farm import (
    BUILD_PREFIX,
    assert_each_success_baked_once,
    assert_nothing_held,
    build_runs,
    history_name,
    make_daemon_farm,
    running_farm,
    submit,
    wait_for_runs,
)
from rocm_assets_tests.servers.dockerd import EnginePool, copy_e2e, make_builders
from rocm_assets_tests.servers.registry import RegistryServer

pytestmark = [pytest.mark.real, pytest.mark.slow]

NODES = 4
# 15 arches x 10 root targets: BURST independent builds.
ARCHES = ("gfx942", *(f"gfx9{i:02d}" for i in range(14)))
ROOTS = ("base", *(f"leaf-{i}" for i in range(9)))
BURST = len(ARCHES) * len(ROOTS)
SUBMITTERS = 8
# Guards against a stuck run, not a timing: about 4 s of run worker and bake per build here.
GUARD_S = 1800.0
# More roots, each base's build under another tag: no two builds push the same image.
LEAVES = "".join(
    f'\ntarget "{leaf}" {{\n  inherits = ["base"]\n'
    f'  tags     = ["${{REGISTRY}}/e2e/{leaf}:${{GPU_ARCH}}"]\n}}\n'
    for leaf in ROOTS[1:]
)


def test_a_burst_of_single_build_runs_is_placed_one_per_machine(
    tmp_path: Path,
    registry_server: RegistryServer,
    engines: EnginePool,
    e2e_context: Path,
    record_property: Callable[[str, object], None],
) -> None:
    names = [f"b{i}" for i in range(NODES)]
    builders = make_builders(
        tmp_path / "docker-config", {b: engines.get(i) for i, b in enumerate(names)}
    )
    bake_file = copy_e2e(tmp_path / "e2e", arches=ARCHES, extra=LEAVES)
    farm = make_daemon_farm(
        tmp_path / "farm",
        builders,
        registry_server,
        bake_file,
        {f"n-{b}": b for b in names},
        HOLD_S="0",
    )
    requests = [(target, arch) for arch in ARCHES for target in ROOTS]
    with running_farm(farm) as (instance, workspace):
        with ThreadPoolExecutor(SUBMITTERS) as pool:
            submitted = list(
                pool.map(
                    lambda r: submit(instance, workspace, target=r[0], partition=r[1]), requests
                )
            )
        assert len(set(submitted)) == BURST
        took_s = wait_for_runs(instance, farm, BURST, GUARD_S)
        runs = build_runs(instance)
        assert sorted(r.run_id for r in runs) == sorted(submitted)
        failed = {
            r.run_id[:8]: r.status.value for r in runs if r.status != dg.DagsterRunStatus.SUCCESS
        }
        assert failed == {}, farm.logs_tail()
        assert_nothing_held(instance)
        assert_each_success_baked_once(farm, runs, names)
        records = [instance.get_run_record_by_id(r.run_id) for r in runs]
        waits = sorted(r.start_time - r.create_timestamp.timestamp() for r in records)
        per_node = Counter(r.tags[ROCM_NODE_TAG] for r in runs)
    assert farm.builders.overlaps(BUILD_PREFIX, {history_name(r) for r in runs}) == []
    assert "Traceback" not in farm.log("daemon"), farm.log("daemon")[-3000:]
    record_property("burst_runs", BURST)
    record_property("all_ended_after_s", round(took_s, 1))
    record_property("queue_wait_median_s", round(median(waits), 1))
    record_property("queue_wait_max_s", round(waits[-1], 1))
    record_property("builds_per_node", dict(sorted(per_node.items())))
