"""Builds that are not this farm's, on a farm that runs (issue 44).

The farm as deployed (rocm_assets_tests/helpers/daemon_farm.py): rocm-assets' coordinator with
its shipped foreign-build settings, the real `dagster-daemon run`, and a code server whose run
workers bake for real on two builders, each a docker context of an engine of its own (Debian
13's dockerd 26, buildx 0.29). Before the request, two builds are started by hand with
`docker buildx build`: a sibling project's, named by its convention, on b1, and an unnamed one
on b2. Then a request of the e2e farm's default group (4 builds), whose plan wants both nodes.

Asserted: while they hold their nodes, a waiting run's `rocm/waiting_for` and `rocm-assets watch
--once` name them; every build of the farm succeeds, each baked once, no claim is left; and on
each engine BuildKit's own history shows no record of the farm overlapping the foreign one.
"""

import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest

from rocm_assets.core.common.constants import ROCM_WAITING_FOR_TAG
from rocm_assets_tests.helpers import rocm_assets_cli, wait_until
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
from rocm_assets_tests.servers.dockerd import (
    E2E_BAKE_FILE,
    EnginePool,
    hand_build,
    make_builders,
    record_span,
)
from rocm_assets_tests.servers.registry import RegistryServer

pytestmark = [pytest.mark.real, pytest.mark.slow]

NODES = {"n-b1": "b1", "n-b2": "b2"}
ARCH = "gfx942"
BUILDS = 4
HOLD_S = 4
SIBLING = "rocm-sibling/base/gfx942/r7"
# The foreign builds' lengths: the farm's request comes while both run.
NAMED_S, UNNAMED_S = 40, 25
GUARD_S = 600.0


def test_builds_not_of_this_farm_hold_their_nodes_until_they_end(
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
    began = time.time()
    context = tmp_path / "foreign"
    hand: list = []

    def foreign_records(builder: str) -> list:
        return [
            r
            for r in builders.history(builder)
            if not r.name.startswith(BUILD_PREFIX) and record_span(r)[0].timestamp() >= began - 5
        ]

    try:
        with running_farm(farm) as (instance, workspace):
            hand.append(hand_build(builders, "b1", NAMED_S, context, SIBLING))
            hand.append(hand_build(builders, "b2", UNNAMED_S, context))
            wait_until(
                lambda: all(
                    any(r.status == "Running" for r in foreign_records(b)) for b in NODES.values()
                ),
                "both foreign builds running",
                120.0,
                poll_s=0.2,
            )
            # The daemon reads each history every 2 s: a request sooner than that is placed on
            # what it last read, and its worker, looking again before its bake, waits instead.
            time.sleep(5.0)
            submit(instance, workspace, "default", partition=ARCH)

            def told() -> bool:
                tags = [r.tags.get(ROCM_WAITING_FOR_TAG, "") for r in build_runs(instance)]
                return any("(not this farm's)" in t for t in tags)

            wait_until(told, f"a waiting run told of a foreign build\n{farm.logs_tail()}", 120.0)
            shown = rocm_assets_cli("watch", "--once", env=farm.env, timeout_s=60.0)
            assert shown.returncode == 0, shown.stderr
            assert f"held by {SIBLING} (not this farm's)" in shown.stdout, shown.stdout
            assert "held by unnamed build (" in shown.stdout, shown.stdout
            took_s = wait_for_runs(instance, farm, BUILDS, GUARD_S)
            runs = build_runs(instance)
            failed = {
                r.run_id[:8]: r.status.value
                for r in runs
                if r.status != dg.DagsterRunStatus.SUCCESS
            }
            assert failed == {}, farm.logs_tail()
            assert_nothing_held(instance)
            assert_each_success_baked_once(farm, runs, list(NODES.values()))
        assert [proc.wait(timeout=60) for proc in hand] == [0, 0]
    finally:
        for proc in hand:
            proc.kill()
            proc.wait()
    ours = {history_name(r) for r in runs}
    for builder in NODES.values():
        [foreign] = foreign_records(builder)
        f0, f1 = record_span(foreign)
        farm_records = [r for r in builders.history(builder, BUILD_PREFIX) if r.name in ours]
        overlapping = [
            r.name for r in farm_records if record_span(r)[0] < f1 and f0 < record_span(r)[1]
        ]
        assert overlapping == [], (builder, foreign.name, overlapping)
    assert "Traceback" not in farm.log("daemon"), farm.log("daemon")[-3000:]
    record_property("all_ended_s", round(took_s, 1))
