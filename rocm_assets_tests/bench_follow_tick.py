"""The plan follower's daemon ticks at the idle-node check's cap, with and without the check.

`rocm-assets bench` times a following tick at 1,000 queued builds, where the check is off (over
`solver_max_builds`, 300). This measures what the check costs where it runs: 300 queued builds
of the shipped default group on a random 50-node fleet, builds ending at noisy times (lognormal,
sigma 0.3) so nodes free up while their next planned build waits. The name keeps this module
out of the default `test_*.py` collection; run it on purpose:

    pytest rocm_assets_tests/bench_follow_tick.py

Real: the shipped rocm-bake.hcl and fleet costs, the PlanFollower the daemon runs (no solver:
the heuristics' plans, so the ticks measured are the follower's own work).
"""

import functools
import random
import statistics
import time

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from rocm_assets.cli.bench.scenarios import arch_names, make_problem, random_fleet, real_builds
from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.nodes.fleet import Fleet, load_fleet
from rocm_assets.core.placement import Build, CostModel
from rocm_assets.core.placement.farm import FarmState, FollowSettings, Running
from rocm_assets.core.placement.follow import PlanFollower
from rocm_assets_tests.helpers import PROJECT_ROOT

QUEUED = 300
TICKS = 150


@functools.cache
def _shipped() -> tuple[BakeGraph, Fleet]:
    # Read once: the rounds time the ticks, not the files.
    return load_graph(PROJECT_ROOT / "rocm-bake.hcl", {}), load_fleet(PROJECT_ROOT / "fleet.yaml")


def _ticks(fill: bool) -> tuple[list[float], int]:
    """One seeded run of TICKS ticks: each tick's seconds, and how many builds started."""
    graph, shipped = _shipped()
    rng = random.Random(1)
    builds, deps = real_builds(graph, arch_names(graph, 30))
    fleet = random_fleet(rng, shipped.costs, shipped.reference, size=50)
    problem = make_problem(builds, deps, fleet)
    order = [problem.index.builds[i] for i in problem.index.topo]
    pending = {b: deps[b] for b in order[-QUEUED:]}
    built_on = {b: rng.choice(fleet.nodes).name for b in order[:-QUEUED]}
    running: dict[Build, Running] = {}
    real_end: dict[Build, float] = {}
    cost = CostModel(fleet)
    follower = PlanFollower(None, FollowSettings(fill_idle_nodes=fill))
    now = 0.0
    decision = follower.tick(
        FarmState(now, dict(pending), {}, fleet.nodes, cost, built_on=built_on)
    )
    times, starts = [], 0
    for _ in range(TICKS):
        for s in decision.starts:
            del pending[s.build]
            running[s.build] = Running(s.node, now, s.est_finish_s)
            real_end[s.build] = now + (s.est_finish_s - now) * rng.lognormvariate(0.0, 0.3)
        starts += len(decision.starts)
        now = min(real_end[b] for b in running)
        for b in [b for b in running if real_end[b] <= now]:
            built_on[b] = running.pop(b).node
        state = FarmState(now, dict(pending), dict(running), fleet.nodes, cost, built_on=built_on)
        started = time.perf_counter()
        decision = follower.tick(state)
        times.append(time.perf_counter() - started)
    return times, starts


@pytest.mark.parametrize("fill", [False, True], ids=["fill-off", "fill-on"])
def test_follow_tick_at_the_fill_cap(benchmark: BenchmarkFixture, fill: bool) -> None:
    runs: list[tuple[list[float], int]] = []
    benchmark.pedantic(lambda: runs.append(_ticks(fill)), rounds=3, warmup_rounds=0)
    times = [t for ticks, _ in runs for t in ticks]
    benchmark.extra_info["tick_median_ms"] = round(1000 * statistics.median(times), 2)
    benchmark.extra_info["tick_max_ms"] = round(1000 * max(times), 2)
    # Every run started builds all along (the farm moved), the same seeded run each round.
    assert all(starts > TICKS for _, starts in runs)
    assert len({starts for _, starts in runs}) == 1
