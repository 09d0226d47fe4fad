"""Placement overhead: the coordinator's decision for 1,000 queued builds on 50 nodes.

Issue 12 sets the target for the plan follower's tick: under 10 ms while the plan holds (issue 6
set 50 ms for the whole-DAG decision, `choose_placements`, measured beside it). The name keeps
this module out of the default `test_*.py` collection; run it on purpose:

    pytest rocm_assets_tests/bench_placement.py

Pure: no server involved. The fleets are the test module's stand-ins.
"""

import random

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from rocm_assets.core.placement import (
    STRATEGIES,
    Build,
    CostModel,
    Decision,
    FarmState,
    Problem,
    Running,
    choose_placements,
    plan,
)
from rocm_assets.core.placement.follow import PlanFollower
from rocm_assets_tests.helpers.placement import (
    FakeCost,
    FakeFleet,
    FakeNode,
    random_problem,
    seed_builds,
)
from rocm_assets_tests.helpers.seed import SEED_GRAPH

QUEUED = 1000
NODES = 50


def _fleet(rng: random.Random, targets: list[str]) -> FakeFleet:
    nodes = tuple(
        FakeNode(
            f"n{p:02d}",
            cores=rng.choice([8, 16, 32, 48, 64]),
            mem_gb=rng.uniform(15, 256),
            link_mbps=40 * 25 ** rng.random(),
        )
        for p in range(NODES)
    )
    costs = {t: FakeCost(60 * 180 ** rng.random(), rng.uniform(0.05, 12)) for t in targets}
    return FakeFleet(nodes, costs)


def _queue(
    rng: random.Random, deps: dict[Build, frozenset[Build]], fleet: FakeFleet
) -> tuple[set[Build], dict[Build, tuple[str, float]], dict[Build, str]]:
    """A farm mid-run: the first builds in dependency order pushed, one running on each of 20
    nodes, exactly QUEUED pending."""
    order: list[Build] = []
    seen: set[Build] = set()

    def visit(b: Build) -> None:
        if b not in seen:
            seen.add(b)
            for d in sorted(deps.get(b, frozenset())):
                visit(d)
            order.append(b)

    for b in sorted(deps):
        visit(b)
    extra = len(order) - QUEUED
    assert extra >= 20, "the graph must be larger than the queue"
    pushed = {b: rng.choice(fleet.nodes).name for b in order[: extra - 20]}
    running = {
        b: (node.name, rng.uniform(100, 3000))
        for b, node in zip(order[extra - 20 : extra], fleet.nodes[:20], strict=True)
    }
    return set(order[extra:]), running, pushed


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_decision_seed_graph(benchmark: BenchmarkFixture, strategy: str) -> None:
    # The seed's graph for 90 arches (1,082 builds), 62 done or running, 1,000 queued.
    rng = random.Random(1)
    fleet = _fleet(rng, list(SEED_GRAPH))
    _, deps = seed_builds([f"gfx{a}" for a in range(90)])
    pending, running, pushed = _queue(rng, deps, fleet)
    cost = CostModel(fleet)
    decision: Decision = benchmark(
        choose_placements, pending, running, fleet.nodes, cost, 0.0, deps, pushed, strategy
    )
    benchmark.extra_info["starts"] = len(decision.starts)
    assert len(pending) == QUEUED
    assert len(decision.starts) + len(decision.waiting) == QUEUED


def test_decision_random_dag(benchmark: BenchmarkFixture) -> None:
    # A layered random DAG of 1,200 builds (up to 3 inputs each), 200 done or running.
    rng = random.Random(2)
    builds = [Build(f"t{k:04d}", "gfx942") for k in range(QUEUED + 200)]
    fleet = _fleet(rng, [b.target for b in builds])
    deps: dict[Build, frozenset[Build]] = {}
    for k, b in enumerate(builds):
        deps[b] = frozenset(rng.sample(builds[max(0, k - 60) : k], min(k, rng.randint(0, 3))))
    pending, running, pushed = _queue(rng, deps, fleet)
    decision: Decision = benchmark(
        choose_placements, pending, running, fleet.nodes, CostModel(fleet), 0.0, deps, pushed
    )
    assert len(decision.starts) + len(decision.waiting) == QUEUED


def test_follower_tick_seed_graph(benchmark: BenchmarkFixture) -> None:
    # The same farm as test_decision_seed_graph; the follower made its plan (not timed). Each
    # timed tick sees the farm one step on: the running build due first has finished on
    # estimate and the builds the previous tick started are running. No tick re-plans.
    rng = random.Random(1)
    fleet = _fleet(rng, list(SEED_GRAPH))
    _, deps = seed_builds([f"gfx{a}" for a in range(90)])
    queued, in_flight, pushed = _queue(rng, deps, fleet)
    pending = {b: deps[b] for b in queued}
    running = {b: Running(node, 0.0, end) for b, (node, end) in in_flight.items()}
    cost = CostModel(fleet)
    follower = PlanFollower()
    clock = [0.0]
    decision = follower.tick(FarmState(0.0, dict(pending), dict(running), fleet.nodes, cost))

    def step() -> FarmState:
        for s in decision.starts:
            pending.pop(s.build, None)
            running[s.build] = Running(s.node, clock[0], s.est_finish_s)
        clock[0] = min(r.est_end_s for r in running.values())
        for b in [b for b, r in running.items() if r.est_end_s <= clock[0]]:
            pushed[b] = running.pop(b).node
        state = FarmState(
            clock[0], dict(pending), dict(running), fleet.nodes, cost, built_on=dict(pushed)
        )
        return state

    def tick(state: FarmState) -> None:
        nonlocal decision
        decision = follower.tick(state)

    benchmark.pedantic(tick, setup=lambda: ((step(),), {}), rounds=30)
    assert follower.replans == 1
    assert len(decision.starts) + len(decision.waiting) == len(pending)


def test_plan_random_instance(benchmark: BenchmarkFixture) -> None:
    # What `rocm-assets plan` and the simulator pay per instance: up to 24 targets, 12 nodes,
    # every heuristic and the lower bounds (LP included when scipy is installed).
    rng = random.Random(3)
    problems = [random_problem(rng) for _ in range(20)]

    def run() -> None:
        for p in problems:
            plan(Problem(p.builds, p.deps, p.nodes, p.cost, p.placed))

    benchmark(run)
