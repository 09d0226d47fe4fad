"""The farm's own overhead: the coordinator's decision time, the code location's load, and the
event records a 100k-line bake writes to its run's event log.

The registry observation tick is measured by the test suite's benchmarks
(`rocm_assets_tests/bench_registry_tick.py`), against the real docker-registry and the Zot fake
that live there.
"""

import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rocm_assets.cli.bench.scenarios import (
    Settings,
    arch_names,
    make_problem,
    random_fleet,
    real_builds,
)
from rocm_assets.cli.common import CliError
from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.build.builds import Build
from rocm_assets.core.common.constants import BAKE_FILE_ENV
from rocm_assets.core.nodes.fleet import Fleet
from rocm_assets.core.placement import STRATEGIES, CostModel, choose_placements
from rocm_assets.core.placement.farm import FarmState, Running
from rocm_assets.core.placement.follow import PlanFollower
from rocm_assets.core.placement.runners import InlineSolver

# Issue 12: one following tick of the coordinator; issue 6: the code location's load.
TARGET_TICK_S = 0.010
TARGET_LOAD_S = 0.5
# Issue 24: about what a PyTorch bake prints.
BAKE_LINES = 100_000


@dataclass(frozen=True)
class OverheadContext:
    graph: BakeGraph
    fleet: Fleet
    settings: Settings


def decision_overhead(ctx: OverheadContext) -> dict[str, Any]:
    """The placement decision for 1,000 queued builds on 50 nodes: the default group for 90
    arches (1,082 builds), the first 62 in dependency order pushed, 20 running, 1,000 queued;
    a random 50-node fleet with the shipped costs. `coordinator`: one following tick of the
    PlanFollower (`coordinator_tick`); the strategies: `choose_placements`, the whole remaining
    DAG planned, as the coordinator decided before the follower."""
    rng = random.Random(ctx.settings.seed)
    builds, deps = real_builds(ctx.graph, arch_names(ctx.graph, 90))
    fleet = random_fleet(rng, ctx.fleet.costs, ctx.fleet.reference, size=50)
    problem = make_problem(builds, deps, fleet)
    order = [problem.index.builds[i] for i in problem.index.topo]
    queued = 1000
    extra = len(order) - queued
    running = {
        b: (node.name, rng.uniform(100, 3000))
        for b, node in zip(order[extra - 20 : extra], fleet.nodes[:20], strict=True)
    }
    pending = order[extra:]
    out: dict[str, Any] = {"queued": queued, "nodes": len(fleet.nodes), "builds": len(order)}
    for strategy in STRATEGIES:
        times = []
        for _ in range(ctx.settings.decision_repeats):
            cost = CostModel(fleet)
            started = time.perf_counter()
            decision = choose_placements(
                pending, running, fleet.nodes, cost, 0.0, deps, strategy=strategy
            )
            times.append(time.perf_counter() - started)
        out[strategy] = {
            "median_ms": round(1000 * statistics.median(times), 2),
            "max_ms": round(1000 * max(times), 2),
            "starts": len(decision.starts),
        }
    built_on = {b: rng.choice(fleet.nodes).name for b in order[: extra - 20]}
    out["coordinator"] = coordinator_tick(
        {b: deps[b] for b in pending},
        {b: Running(node, 0.0, end) for b, (node, end) in running.items()},
        built_on,
        fleet,
        ctx.settings.decision_repeats,
    )
    out["target_ms"] = TARGET_TICK_S * 1000
    return out


def coordinator_tick(
    pending: dict[Build, frozenset[Build]],
    running: dict[Build, Running],
    built_on: dict[Build, str],
    fleet: Fleet,
    repeats: int,
) -> dict[str, Any]:
    """A PlanFollower (its solver runner inline, as the bench runs it) makes its plan, then the
    farm moves on: the builds it started run, the next to end finishes at its estimate, and
    the tick that follows is timed. `repeats` such ticks, each a few builds finished and a few
    started; none may re-plan (the estimates are exact), so each is what a daemon tick costs
    while the plan holds. The first tick (the plan: every heuristic over the whole queue) is
    `replan_ms`."""
    cost = CostModel(fleet)
    follower = PlanFollower(InlineSolver())
    now = 0.0
    started = time.perf_counter()
    decision = follower.tick(FarmState(now, dict(pending), dict(running), fleet.nodes, cost))
    replan_s = time.perf_counter() - started
    times, starts = [], 0
    for _ in range(repeats):
        for s in decision.starts:
            del pending[s.build]
            running[s.build] = Running(s.node, now, s.est_finish_s)
        now = min(r.est_end_s for r in running.values())
        for b in [b for b, r in running.items() if r.est_end_s <= now]:
            built_on[b] = running.pop(b).node
        state = FarmState(
            now, dict(pending), dict(running), fleet.nodes, cost, built_on=dict(built_on)
        )
        started = time.perf_counter()
        decision = follower.tick(state)
        times.append(time.perf_counter() - started)
        starts += len(decision.starts)
    return {
        "median_ms": round(1000 * statistics.median(times), 3),
        "max_ms": round(1000 * max(times), 3),
        "ticks": len(times),
        "starts": starts,
        "replans_after_the_first": follower.replans - 1,
        "replan_ms": round(1000 * replan_s, 1),
        "queued_at_the_end": len(pending),
    }


_LOAD_SCRIPT = """
import json, time
t0 = time.perf_counter()
import dagster
t1 = time.perf_counter()
from rocm_assets.definitions import defs
t2 = time.perf_counter()
defs().get_repository_def()
t3 = time.perf_counter()
print(json.dumps({"import_dagster_s": t1 - t0, "import_module_s": t2 - t1, "defs_s": t3 - t2}))
"""


def load_overhead(ctx: OverheadContext) -> dict[str, Any]:
    """The code location's load over a bare `import dagster`, each sample a fresh interpreter:
    importing rocm_assets.definitions, then parsing and evaluating the bake file and building
    the Definitions and their repository (what a code server does at start)."""
    samples = []
    for _ in range(ctx.settings.load_repeats):
        done = subprocess.run(
            [sys.executable, "-c", _LOAD_SCRIPT],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, BAKE_FILE_ENV: str(ctx.graph.path)},
            timeout=300,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise CliError(f"loading rocm_assets.definitions failed: {last}")
        samples.append(json.loads(done.stdout.strip().splitlines()[-1]))
    over = [s["import_module_s"] + s["defs_s"] for s in samples]
    k = over.index(statistics.median_low(over))
    return {
        "samples": len(samples),
        "over_import_dagster_s": round(over[k], 3),
        "import_module_s": round(samples[k]["import_module_s"], 3),
        "defs_s": round(samples[k]["defs_s"], 3),
        "import_dagster_s": round(samples[k]["import_dagster_s"], 3),
        "target_s": TARGET_LOAD_S,
    }


def bake_output_overhead(ctx: OverheadContext) -> dict[str, Any]:
    """Event records per 100k-line build: one Dagster run whose bake prints BAKE_LINES lines,
    in a fresh interpreter (`bake_output`), and the lines its compute log kept."""
    done = subprocess.run(
        [sys.executable, "-m", "rocm_assets.cli.bench.bake_output", str(BAKE_LINES)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CliError(f"the bake output run failed: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


OVERHEADS: dict[str, Callable[[OverheadContext], dict[str, Any]]] = {
    "placement_decision": decision_overhead,
    "code_location_load": load_overhead,
    "bake_output": bake_output_overhead,
}
