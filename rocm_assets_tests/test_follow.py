"""The plan follower: following a plan, re-planning on drift, the solver runners, noisy runs.

No server is involved: the follower is pure. Real parts: OR-Tools CP-SAT solves inline and in the
background thread (`ThreadSolver` runs a real thread); the simulator plays whole runs. The fleet
and costs are the placement tests' stand-ins. Loops that wait for the thread have a deadline so
a regression fails rather than hangs; nothing asserts a time.
"""

import math
import random
import sys
import time
from collections.abc import Mapping
from itertools import pairwise

import pytest

from rocm_assets.core.placement import Build, CostModel, Problem, plan
from rocm_assets.core.placement.bounds import lower_bounds, validate_schedule
from rocm_assets.core.placement.farm import (
    FarmState,
    FollowSettings,
    Hold,
    Running,
    solver_budget_s,
)
from rocm_assets.core.placement.fill import best_move
from rocm_assets.core.placement.follow import PlanFollower
from rocm_assets.core.placement.problem import Run, left_shift
from rocm_assets.core.placement.robust import Spread, draws, mean_makespan, order_of, retime
from rocm_assets.core.placement.runners import (
    InlineSolver,
    SolveOutcome,
    SolveRequest,
    ThreadSolver,
)
from rocm_assets.core.placement.simulate import SimulationError, noise_factors, simulate
from rocm_assets.core.placement.simulated import SimulatedCoordinator
from rocm_assets.core.placement.solver import solve
from rocm_assets_tests.helpers.placement import (
    FakeCost,
    FakeFleet,
    FakeNode,
    ScriptedRunner,
    random_problem,
    seed_builds,
)

N1, N2 = FakeNode("n1"), FakeNode("n2")
A, B, C, D = Build("a"), Build("b"), Build("c"), Build("d")
# Tiny images: transfers cost well under a second, so the times below are the build seconds.
COSTS = {t: FakeCost(100.0, 0.0001) for t in "abcd"}
COST = CostModel(FakeFleet((N1, N2), COSTS))
DEADLINE_S = 60.0


def farm(
    now: float,
    pending: Mapping[Build, frozenset[Build]],
    running: Mapping[Build, Running] | None = None,
    nodes: tuple[FakeNode, ...] = (N1, N2),
    *,
    built_on: Mapping[Build, str] | None = None,
    busy: Mapping[str, float] | None = None,
    unpublished: Mapping[Build, str] | None = None,
) -> FarmState:
    return FarmState(
        now,
        pending,
        running or {},
        nodes,
        COST,
        built_on=built_on or {},
        holds=[
            Hold(node, 0.0, until, "a run outside the plan") for node, until in (busy or {}).items()
        ],
        unpublished=unpublished or {},
    )


def chain() -> dict[Build, frozenset[Build]]:
    """b needs a; c stands alone."""
    return {A: frozenset(), B: frozenset({A}), C: frozenset()}


def started(follower: PlanFollower, state: FarmState) -> dict[Build, str]:
    return {s.build: s.node for s in follower.tick(state).starts}


def test_first_tick_plans_and_starts_one_eligible_build_per_free_node() -> None:
    follower = PlanFollower()
    decision = follower.tick(farm(0.0, chain()))
    assert {s.build for s in decision.starts} == {A, C}
    assert len({s.node for s in decision.starts}) == 2
    assert all(
        s.est_start_s == 0.0 and s.est_finish_s == pytest.approx(100, abs=1)
        for s in decision.starts
    )
    assert decision.waiting[B].reason == "waits for a" and decision.waiting[B].deps == (A,)
    view = follower.plan()
    assert view is not None and view.strategy.startswith("default(") and view.reason == "first plan"
    assert sorted(b for q in view.queues.values() for b in (p.build for p in q)) == [A, B, C]
    assert view.makespan_s == pytest.approx(200, abs=1)
    # The same state again (the caller did not apply the starts): the same starts, no re-plan.
    again = follower.tick(farm(5.0, chain())).starts
    assert [(s.build, s.node) for s in again] == [(s.build, s.node) for s in decision.starts]
    assert follower.replans == 1


def test_each_node_takes_its_planned_builds_in_order_once_inputs_are_published() -> None:
    follower = PlanFollower()
    first = started(follower, farm(0.0, chain()))
    view = follower.plan()
    assert view is not None
    (b_node,) = [node for node, q in view.queues.items() if any(p.build == B for p in q)]
    # b is planned after a on a's node: locality, no pull.
    assert first[A] == b_node
    running = {A: Running(first[A], 0.0, 100.0), C: Running(first[C], 0.0, 100.0)}
    mid = follower.tick(farm(50.0, {B: frozenset({A})}, running))
    assert mid.starts == () and mid.waiting[B].reason == "waits for a"
    done = follower.tick(farm(100.0, {B: frozenset({A})}, {}, built_on={A: first[A], C: first[C]}))
    assert [(s.build, s.node) for s in done.starts] == [(B, b_node)]
    assert follower.replans == 1


class FirstPlan:
    """A coordinator policy that keeps the follower's first plan: per node queue and finish."""

    def __init__(self, coordinator: SimulatedCoordinator) -> None:
        self.coordinator = coordinator
        self.queues: dict[str, list[Build]] = {}
        self.makespan_s = 0.0

    def __call__(
        self,
        now: float,
        pending: set[Build],
        running: dict[Build, Running],
        pushed: dict[Build, str],
    ) -> list[tuple[Build, str]]:
        out = self.coordinator(now, pending, running, pushed)
        view = self.coordinator.follower.plan()
        if not self.queues and view is not None:
            self.queues = {n: [x.build for x in q] for n, q in view.queues.items()}
            self.makespan_s = view.makespan_s
        return out


def test_a_followed_plan_on_exact_estimates_never_replans_and_keeps_its_makespan() -> None:
    rng = random.Random(7)
    moved = 0
    for case in range(15):
        p = random_problem(rng)
        problem = Problem(p.builds, p.deps, p.nodes, p.cost)
        for fill in (False, True):
            coordinator = SimulatedCoordinator(problem, None, FollowSettings(fill_idle_nodes=fill))
            first = FirstPlan(coordinator)
            schedule = simulate(problem, first, "coordinator", wake=coordinator.wake)
            assert coordinator.follower.replans == 1, case
            by_node: dict[str, list[Build]] = {}
            for a in schedule.assignments:
                by_node.setdefault(a.node, []).append(a.build)
            if fill:
                # A move onto an idle node never lengthens the plan.
                assert schedule.makespan_s <= first.makespan_s + 1e-6, case
                moved += by_node != first.queues
            else:
                assert schedule.makespan_s == pytest.approx(first.makespan_s), case
                assert by_node == first.queues, case
    # The heuristics' plans leave nodes idle that a ready build could use at no cost.
    assert moved > 0


def test_a_ready_build_moves_onto_an_idle_node_only_when_the_plan_gains() -> None:
    ix = Problem((A, B, C), chain(), (N1, N2), COST).index
    avail0 = [0.0, 0.0]
    # n1 builds a then c; n2 waits for a before b: n2 idles for a's 100 s while c is ready.
    slots = {A: ("n1", 0.0, 100.0), C: ("n1", 100.0, 200.0), B: ("n2", 100.0, 200.0)}
    current = retime(ix, avail0, slots)
    assert current is not None

    def makespan(run: Run) -> float:
        return round(run.makespan, 6)

    run = best_move(ix, avail0, slots, ["n2"], [C], makespan)
    assert run is not None
    c, b = ix.pos[C], ix.pos[B]
    # c first on n2, done at 100 instead of 200; b still ends when it did.
    assert ix.names[run.node_of[c]] == "n2" and run.end[c] == pytest.approx(100, abs=1)
    assert run.end[b] == pytest.approx(current.end[b]) and run.makespan <= current.makespan
    # On a node four times slower, c would end past the plan's finish: no move.
    slow = FakeNode("n2", cores=2, mem_gb=4.0)
    ix_slow = Problem((A, B, C), chain(), (N1, slow), CostModel(FakeFleet((N1, slow), COSTS))).index
    assert best_move(ix_slow, avail0, slots, ["n2"], [C], makespan) is None
    # Nothing to gain when the idle node is the build's own.
    assert best_move(ix, avail0, slots, ["n1"], [C], makespan) is None


def test_the_follower_fills_an_idle_node_and_follows_the_moved_plan() -> None:
    # Found by search over seeded noisy runs: the same run with and without the move.
    rng = random.Random(11)
    differ = 0
    for case in range(12):
        p = random_problem(rng)
        problem = Problem(p.builds, p.deps, p.nodes, p.cost)
        factors = noise_factors(problem, f"fill#{case}")
        out = {}
        for fill in (False, True):
            coordinator = SimulatedCoordinator(problem, None, FollowSettings(fill_idle_nodes=fill))
            # simulate validates every schedule: deps before dependents, one build per node.
            out[fill] = simulate(
                problem, coordinator, "coordinator", factors=factors, wake=coordinator.wake
            )
        differ += out[True].assignments != out[False].assignments
    assert differ > 0


def test_a_new_request_replans() -> None:
    follower = PlanFollower()
    follower.tick(farm(0.0, chain()))
    pending = {**chain(), D: frozenset({C})}
    follower.tick(farm(1.0, pending))
    view = follower.plan()
    assert follower.replans == 2 and view is not None and view.reason == "new request: d"
    assert D in {p.build for q in view.queues.values() for p in q}


def test_a_build_running_past_its_estimate_by_the_margin_replans_once() -> None:
    follower = PlanFollower(settings=FollowSettings(replan_drift_margin=0.25))
    first = started(follower, farm(0.0, chain()))
    running = {A: Running(first[A], 0.0, 100.0), C: Running(first[C], 0.0, 100.0)}
    # c is done at 100; a is still running.
    late = {A: running[A]}
    follower.tick(farm(100.0, {B: frozenset({A})}, late, built_on={C: first[C]}))
    follower.tick(farm(124.0, {B: frozenset({A})}, late, built_on={C: first[C]}))
    assert follower.replans == 1
    # a's estimate is 100 s plus well under a second of transfers: 25% past it is just over 125.
    follower.tick(farm(126.0, {B: frozenset({A})}, late, built_on={C: first[C]}))
    view = follower.plan()
    assert follower.replans == 2 and view is not None
    assert view.reason == "a on " + first[A] + " ran 25% past its estimate"
    # The plan now expects a to take 25% of its 126 s more: no re-plan at the next ticks.
    assert follower.next_check_s() == pytest.approx(126 * 1.25 * 1.25)
    follower.tick(farm(130.0, {B: frozenset({A})}, late, built_on={C: first[C]}))
    assert follower.replans == 2
    # b still follows a's node once a is done.
    done = follower.tick(farm(150.0, {B: frozenset({A})}, built_on={A: first[A], C: first[C]}))
    assert [s.build for s in done.starts] == [B]


def test_a_build_finishing_well_before_its_estimate_replans() -> None:
    settings = FollowSettings(replan_early_margin=0.1)
    for end, replans in ((95.0, 1), (85.0, 2)):
        follower = PlanFollower(settings=settings)
        first = started(follower, farm(0.0, chain()))
        running = {A: Running(first[A], 0.0, 100.0), C: Running(first[C], 0.0, 100.0)}
        follower.tick(farm(1.0, {B: frozenset({A})}, running))
        # a is done at `end`, c still runs: 5% early is within the margin, 15% is not.
        follower.tick(farm(end, {B: frozenset({A})}, {C: running[C]}, built_on={A: first[A]}))
        view = follower.plan()
        assert follower.replans == replans and view is not None, end
        if replans == 2:
            assert view.reason == "a finished 10% before its estimate"
    # Off: never.
    follower = PlanFollower(settings=FollowSettings(replan_early_margin=None))
    first = started(follower, farm(0.0, chain()))
    follower.tick(farm(1.0, {B: frozenset({A})}, {A: Running(first[A], 0.0, 100.0)}))
    follower.tick(farm(10.0, {B: frozenset({A})}, built_on={A: first[A]}))
    assert follower.replans == 1


def test_the_plan_view_lists_each_node_queue_in_order() -> None:
    follower = PlanFollower()
    pending = {b: frozenset() for b in (A, B, C, D)} | {Build("e"): frozenset({A, B})}
    follower.tick(farm(0.0, pending))
    view = follower.plan()
    assert view is not None and view.generation == 1 and view.made_s == 0.0
    assert sorted(p.build for q in view.queues.values() for p in q) == sorted(pending)
    for node, queue in view.queues.items():
        assert all(p.node == node for p in queue)
        for before, after in pairwise(queue):
            assert after.est_start_s >= before.est_finish_s - 1e-6
    assert view.makespan_s == max(p.est_finish_s for q in view.queues.values() for p in q)


def test_a_cancelled_input_is_not_published_and_its_dependents_wait() -> None:
    follower = PlanFollower()
    pending = {A: frozenset(), B: frozenset({A}), C: frozenset({B}), D: frozenset({C})}
    follower.tick(farm(0.0, pending))
    # a's run was cancelled before it started: it leaves the queue and is known unpublished.
    why = {A: "run 1a2b3c4d was cancelled"}
    rest = {B: frozenset({A}), C: frozenset({B}), D: frozenset({C})}
    decision = follower.tick(farm(10.0, rest, unpublished=why))
    assert decision.starts == ()
    assert follower.replans == 2
    assert decision.waiting[B].reason == "waits for a: not published (run 1a2b3c4d was cancelled)"
    # Below it, each names its own input and the root cause, however deep.
    assert decision.waiting[C].reason == (
        "waits for b, which waits for a: not published (run 1a2b3c4d was cancelled)"
    )
    assert decision.waiting[D].reason == (
        "waits for c, which waits for a: not published (run 1a2b3c4d was cancelled)"
    )
    # Nodes free, nothing changes: still nothing starts, and no more re-plans.
    assert follower.tick(farm(20.0, rest, unpublished=why)).starts == ()
    assert follower.replans == 2
    # a requested again: the plan takes it, then the rest behind it.
    again = follower.tick(farm(30.0, {A: frozenset(), **rest}, unpublished=why))
    assert [s.build for s in again.starts] == [A] and follower.replans == 3


def test_a_failed_running_build_blocks_its_dependents() -> None:
    follower = PlanFollower()
    first = started(follower, farm(0.0, chain()))
    running = {A: Running(first[A], 0.0, 100.0), C: Running(first[C], 0.0, 100.0)}
    follower.tick(farm(10.0, {B: frozenset({A})}, running))
    rest = {C: running[C]}
    decision = follower.tick(farm(40.0, {B: frozenset({A})}, rest, unpublished={A: "run failed"}))
    assert decision.starts == () and follower.replans == 2
    assert decision.waiting[B].reason == "waits for a: not published (run failed)"


def test_a_node_that_disappears_or_comes_back_replans() -> None:
    follower = PlanFollower()
    follower.tick(farm(0.0, {b: frozenset() for b in (A, B, C, D)}, nodes=(N1, N2)))
    follower.tick(farm(1.0, {b: frozenset() for b in (A, B, C, D)}, nodes=(N1,)))
    view = follower.plan()
    assert follower.replans == 2 and view is not None and view.reason == "nodes changed: -n2"
    assert set(view.queues) == {"n1"}
    follower.tick(farm(2.0, {b: frozenset() for b in (A, B, C, D)}, nodes=(N1, N2)))
    view = follower.plan()
    assert follower.replans == 3 and view is not None and view.reason == "nodes changed: +n2"
    assert set(view.queues) == {"n1", "n2"}


def test_a_node_held_outside_the_plan_takes_nothing_until_free() -> None:
    follower = PlanFollower()
    pending = {A: frozenset(), C: frozenset()}
    decision = follower.tick(farm(0.0, pending, busy={"n1": 500.0}))
    assert {s.node for s in decision.starts} == {"n2"} and len(decision.starts) == 1
    follower.tick(farm(10.0, pending, busy={"n1": 500.0}))
    assert follower.replans == 1
    # Held much longer than planned: re-plan.
    follower.tick(farm(20.0, pending, busy={"n1": 5000.0}))
    view = follower.plan()
    assert follower.replans == 2 and view is not None
    assert view.reason == "n1 is held longer than planned"


def test_a_build_started_on_another_node_replans() -> None:
    follower = PlanFollower()
    first = started(follower, farm(0.0, chain()))
    other = "n2" if first[A] == "n1" else "n1"
    # Something else started a on the node the plan gave c, before c started there.
    moved = {A: Running(other, 0.0, 100.0)}
    follower.tick(farm(1.0, {B: frozenset({A}), C: frozenset()}, moved))
    view = follower.plan()
    assert follower.replans == 2 and view is not None
    assert view.reason == f"a started on {other}, planned on {first[A]}"


def test_unknown_inputs_count_as_published_and_bad_input_never_raises() -> None:
    follower = PlanFollower()
    ghost = Build("ghost")
    assert [s.build for s in follower.tick(farm(0.0, {A: frozenset({ghost})})).starts] == [A]
    # No nodes at all: everything waits, nothing raises.
    waiting = PlanFollower().tick(farm(0.0, chain(), nodes=())).waiting
    assert {w.reason for w in waiting.values()} == {"no usable build node"}
    # A dependency cycle: every build waits with the error, said once in the notes.
    cyclic = PlanFollower()
    decision = cyclic.tick(farm(0.0, {A: frozenset({B}), B: frozenset({A})}))
    assert decision.starts == ()
    assert {w.reason for w in decision.waiting.values()} == {"dependency cycle among builds: a, b"}
    assert cyclic.notes() == ["placement cannot plan: dependency cycle among builds: a, b"]
    cyclic.tick(farm(1.0, {A: frozenset({B}), B: frozenset({A})}))
    assert cyclic.notes() == []
    # A build both pending and running (a duplicate request): it waits, the running one stands.
    dup = PlanFollower().tick(farm(0.0, {A: frozenset()}, {A: Running("n1", 0.0, 100.0)}))
    assert dup.starts == () and dup.waiting[A].reason == "a is already running on n1"


def test_waiting_reasons_name_the_queue_position() -> None:
    follower = PlanFollower()
    pending = {b: frozenset() for b in (A, B, C, D)}
    decision = follower.tick(farm(0.0, pending, nodes=(N1,)))
    assert [s.build for s in decision.starts] == [A]
    assert decision.waiting[B].reason == "planned on n1 after a"
    assert decision.waiting[D].reason == "planned on n1 after c"
    after = follower.tick(
        farm(1.0, {b: frozenset() for b in (B, C, D)}, {A: Running("n1", 0.0, 100.0)}, nodes=(N1,))
    )
    assert after.waiting[B].reason == "next on n1 once it is free"
    assert after.waiting[B].est_start_s == pytest.approx(100, abs=1)


def test_solver_budget_grows_with_the_builds_at_stake() -> None:
    s = FollowSettings(
        solver_min_seconds=2, solver_seconds_per_build=0.6, solver_time_limit_seconds=60
    )
    assert solver_budget_s(1, s) == 2
    assert solver_budget_s(10, s) == pytest.approx(6)
    assert solver_budget_s(100, s) == 60
    assert solver_budget_s(1000, s) == 60
    assert solver_budget_s(100, s.scaled(0.5)) == 30


def test_the_solver_plan_is_adopted_only_when_shorter_and_current() -> None:
    rng = random.Random(36)
    p = random_problem(rng, max_nodes=4, max_targets=8)
    pending = {b: p.deps.get(b, frozenset()) for b in p.builds}
    runner = ScriptedRunner()
    follower = PlanFollower(runner)
    state = FarmState(0.0, pending, {}, p.nodes, p.cost)
    follower.tick(state)
    (request,) = runner.requests
    assert request.generation == 1 and request.time_limit_s == solver_budget_s(
        len(pending), follower.settings
    )
    heuristic = follower.plan()
    assert heuristic is not None and heuristic.strategy.startswith("default(")
    result = solve(request.problem, 5.0, request.busy_until, workers=1, hint=request.hint)
    assert result.schedule.makespan_s < request.hint.makespan_s - 1  # this instance: solver wins
    # A result for another generation is dropped.
    runner.outcomes.append(SolveOutcome(0, result))
    follower.tick(state)
    assert follower.plan() == heuristic
    # The current generation's, shorter: adopted, and the plan's finish moves up.
    runner.outcomes.append(SolveOutcome(1, result))
    decision = follower.tick(state)
    view = follower.plan()
    assert view is not None and view.strategy == decision.strategy == "solver"
    assert view.makespan_s == pytest.approx(result.schedule.makespan_s)
    assert view.solver.startswith("adopted: OPTIMAL")
    # A failure is said once and the plan stands.
    runner.outcomes.append(SolveOutcome(1, None, "boom"))
    follower.tick(state)
    assert follower.notes() == ["placement solver failed, the heuristics' plan stands: boom"]
    failed = follower.plan()
    assert failed is not None and failed.strategy == "solver" and failed.queues == view.queues
    assert failed.solver == "failed: boom"


def test_the_plan_view_carries_the_bound_its_own_solve_proved() -> None:
    # The seed graph for two arches: CP-SAT proves far more than placement's static bounds.
    nodes = (
        FakeNode("gaming", cores=16, mem_gb=15, link_mbps=100),
        FakeNode("think", cores=32, mem_gb=122, link_mbps=1000),
        FakeNode("nuc", cores=8, mem_gb=32, link_mbps=40),
    )
    cost = CostModel(FakeFleet(nodes, {"pytorch": FakeCost(7200, 6), "vllm": FakeCost(1320, 2)}))
    builds, deps = seed_builds(["gfx942", "gfx1100"])
    pending = {b: deps[b] for b in builds}
    runner = ScriptedRunner()
    follower = PlanFollower(runner)
    follower.tick(FarmState(0.0, pending, {}, nodes, cost))
    first = follower.plan()
    # Asked, not answered: no proof yet.
    assert first is not None and first.proven_bound_s is None
    (request,) = runner.requests
    result = solve(request.problem, 10.0, request.busy_until, workers=1, hint=request.hint)
    assert result.proven_bound_s > lower_bounds(request.problem).best + 60
    runner.outcomes.append(SolveOutcome(1, result))
    follower.tick(FarmState(0.0, pending, {}, nodes, cost))
    solved = follower.plan()
    assert solved is not None and solved.proven_bound_s == result.proven_bound_s
    assert solved.proven_bound_s <= solved.makespan_s
    # A re-plan is another problem: its bound waits for its own solve, an older one is dropped,
    # and the new proof is on the caller's clock (the plan was made at 10 s).
    follower.tick(FarmState(10.0, pending, {}, nodes[:2], cost))
    runner.outcomes.append(SolveOutcome(1, result))
    follower.tick(FarmState(10.0, pending, {}, nodes[:2], cost))
    replanned = follower.plan()
    assert replanned is not None and replanned.generation == 2
    assert replanned.proven_bound_s is None
    again = runner.requests[-1]
    second = solve(again.problem, 10.0, again.busy_until, workers=1, hint=again.hint)
    runner.outcomes.append(SolveOutcome(2, second))
    follower.tick(FarmState(10.0, pending, {}, nodes[:2], cost))
    view = follower.plan()
    assert view is not None and view.proven_bound_s == pytest.approx(10.0 + second.proven_bound_s)


def test_inline_solver_plans_are_never_longer_than_the_heuristics() -> None:
    adopted = 0
    for seed in (18, 24, 34, 36, 3):
        p = random_problem(random.Random(seed), max_nodes=4, max_targets=8)
        problem = Problem(p.builds, p.deps, p.nodes, p.cost)
        settings = FollowSettings(solver_min_seconds=0.2, solver_seconds_per_build=0.0)
        follower = PlanFollower(InlineSolver(), settings)
        follower.tick(
            FarmState(
                0.0,
                {b: problem.deps.get(b, frozenset()) for b in problem.builds},
                {},
                problem.nodes,
                problem.cost,
            )
        )
        view = follower.plan()
        assert view is not None
        best = plan(problem, "default").makespan_s
        assert view.makespan_s <= best + 1e-6, seed
        adopted += view.strategy == "solver"
    assert adopted >= 3


def test_the_background_solver_never_blocks_a_tick_and_its_result_is_followed() -> None:
    # Five builds where CP-SAT proves a plan 4% shorter than the heuristics' within the budget.
    p = random_problem(random.Random(36), max_nodes=4, max_targets=8)
    pending = {b: p.deps.get(b, frozenset()) for b in p.builds}
    runner = ThreadSolver(workers=1)
    follower = PlanFollower(
        runner, FollowSettings(solver_min_seconds=2.0, solver_seconds_per_build=0.0)
    )
    state = FarmState(0.0, pending, {}, p.nodes, p.cost)
    first = follower.tick(state)
    # The first tick answers with the heuristics' plan; the solver works behind it.
    assert first.strategy.startswith("default(")
    deadline = time.monotonic() + DEADLINE_S
    view = follower.plan()
    while view is not None and view.solver.startswith("solving") and time.monotonic() < deadline:
        follower.tick(state)
        time.sleep(0.05)
        view = follower.plan()
    assert view is not None and view.solver.startswith("adopted"), view.solver
    assert view.strategy == "solver"
    follower.close()
    assert runner._thread is not None and not runner._thread.is_alive()


def test_a_newer_request_stops_the_running_solve() -> None:
    p = random_problem(random.Random(32), max_nodes=4, max_targets=8)
    problem = Problem(p.builds, p.deps, p.nodes, p.cost)
    hint = plan(problem, "greedy")
    runner = ThreadSolver(workers=1)
    # Ten minutes for the first: only a stop ends it within the deadline below.
    runner.submit(SolveRequest(1, problem, {}, hint, 600.0))
    time.sleep(0.5)
    runner.submit(SolveRequest(2, problem, {}, hint, 0.2))
    deadline = time.monotonic() + DEADLINE_S
    seen = []
    while time.monotonic() < deadline and 2 not in seen:
        outcome = runner.poll()
        if outcome is not None:
            seen.append(outcome.generation)
        time.sleep(0.05)
    assert 2 in seen and validate_schedule(problem, hint) == []
    # A solve that would run for ten minutes is stopped by close.
    runner.submit(SolveRequest(3, problem, {}, hint, 600.0))
    time.sleep(0.5)
    runner.close()
    assert runner._thread is not None and not runner._thread.is_alive()
    runner.submit(SolveRequest(4, problem, {}, hint, 0.2))
    assert runner.poll() is None


def test_without_ortools_the_heuristics_plan_alone_and_it_is_said_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ortools.sat.python", None)
    runner = ScriptedRunner()
    follower = PlanFollower(runner)
    notes = follower.notes()
    assert len(notes) == 1 and notes[0].startswith("placement plans with the heuristics alone: ")
    assert "pip install 'ortools>=9.10'" in notes[0]
    decision = follower.tick(farm(0.0, chain()))
    assert decision.strategy.startswith("default(") and {s.build for s in decision.starts} == {A, C}
    assert runner.requests == [] and follower.notes() == []


def test_spread_of_durations_and_mean_makespan_under_draws() -> None:
    spread = Spread()
    for real in (110.0, 90.0):
        spread.add(real, 100.0)
    assert spread.sigma == 0.0  # two builds say too little
    spread.add(100.0 * math.e**0.3, 100.0)
    expected = math.sqrt((math.log(1.1) ** 2 + math.log(0.9) ** 2 + 0.09) / 3)
    assert spread.sigma == pytest.approx(expected)
    on_time = Spread()
    for _ in range(5):
        on_time.add(100.0, 100.0)
    assert on_time.sigma == 0.0
    # Factors of 1 give the plan's own makespan; doubling every duration doubles a plan with
    # no transfers and nothing busy.
    p = random_problem(random.Random(5), max_nodes=4, max_targets=10)
    problem = Problem(p.builds, p.deps, p.nodes, p.cost)
    ix = problem.index
    run = left_shift(ix, *_followed(problem), ix.avail({}))
    order = order_of(ix, run)
    ones = [[1.0] * len(ix.builds)]
    assert mean_makespan(ix, ix.avail({}), run.node_of, order, ones) == pytest.approx(run.makespan)
    rows = draws(len(ix.builds), 0.3, 8, 1)
    assert rows == draws(len(ix.builds), 0.3, 8, 1) and len(rows) == 8
    assert mean_makespan(ix, ix.avail({}), run.node_of, order, rows) > 0


def _followed(problem: Problem) -> tuple[list[int], list[int]]:
    """The default plan's nodes and order, as indices."""
    ix = problem.index
    schedule = plan(problem, "default")
    node_pos = {name: p for p, name in enumerate(ix.names)}
    node_of = [0] * len(ix.builds)
    for a in schedule.assignments:
        node_of[ix.pos[a.build]] = node_pos[a.node]
    order = [ix.pos[a.build] for a in schedule.assignments]
    return node_of, order


def test_the_follower_learns_how_far_durations_stray() -> None:
    follower = PlanFollower()
    pending = {Build(f"x{k}"): frozenset() for k in range(6)}
    first = follower.tick(farm(0.0, pending))
    assert len(first.starts) == 2
    view = follower.plan()
    assert view is not None and view.duration_sigma == 0.0
    now, running, done = 0.0, {}, {}
    # Every build takes 1.5 times its estimate.
    decision = first
    while pending or running:
        for s in decision.starts:
            del pending[s.build]
            running[s.build] = Running(s.node, now, s.est_finish_s)
        ends = {b: r.started_s + 1.5 * (r.est_end_s - r.started_s) for b, r in running.items()}
        now = min(ends.values())
        for b in [b for b, end in ends.items() if end <= now]:
            done[b] = running.pop(b).node
        decision = follower.tick(farm(now, pending, running, built_on=done))
    view = follower.plan()
    assert view is not None and view.duration_sigma == pytest.approx(math.log(1.5), abs=1e-3)


# --- noise -----------------------------------------------------------------------------------


def test_noise_is_seeded_lognormal_and_noisy_runs_validate() -> None:
    rng = random.Random(9)
    p = random_problem(rng, max_nodes=6, max_targets=20)
    problem = Problem(p.builds, p.deps, p.nodes, p.cost)
    f1 = noise_factors(problem, "1:x")
    assert f1 == noise_factors(problem, "1:x") and f1 != noise_factors(problem, "2:x")
    assert all(f > 0 for f in f1.values())
    many = noise_factors(
        Problem(tuple(Build(f"t{k}") for k in range(2000)), {}, p.nodes, p.cost), "s"
    )
    values = sorted(many.values())
    assert 0.95 < values[1000] < 1.05  # median about 1
    # One sigma either side (15.9% and 84.1%): about exp(-0.3) = 0.74 and exp(0.3) = 1.35.
    assert 0.68 < values[317] < 0.8 and 1.25 < values[1682] < 1.47
    coordinator = SimulatedCoordinator(problem, InlineSolver(), FollowSettings().scaled(0.01))
    noisy = simulate(problem, coordinator, "coordinator", factors=f1, wake=coordinator.wake)
    # simulate validated it against the factors; without them the durations do not match.
    assert validate_schedule(problem, noisy, f1) == []
    assert any("the cost model says" in e for e in validate_schedule(problem, noisy))


def test_noisy_runs_replan_and_stay_valid_on_random_instances() -> None:
    rng = random.Random(12)
    replanned = 0
    for case in range(12):
        p = random_problem(rng)
        problem = Problem(p.builds, p.deps, p.nodes, p.cost)
        factors = noise_factors(problem, f"{case}")
        coordinator = SimulatedCoordinator(problem, None)
        try:
            simulate(problem, coordinator, "c", factors=factors, wake=coordinator.wake)
        except SimulationError as exc:
            pytest.fail(f"case {case}: {exc}")
        replanned += coordinator.follower.replans > 1
    assert replanned >= 6
