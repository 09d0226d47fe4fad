"""The CP-SAT plan: valid under the placement cost model, never worse than its warm start.

Real parts: OR-Tools CP-SAT itself (a dependency) solves every model here; no server is
involved. Instances are tiny so each solves to a proven optimum well inside its limit; the
limits are there so a regression fails rather than hangs, and no assertion is about time.
"""

import random
import sys

import pytest

from rocm_assets.core.placement import (
    Build,
    CostModel,
    Problem,
    best_bound,
    lower_bounds,
    plan,
    validate_schedule,
)
from rocm_assets.core.placement.solver import (
    SOLVER_STRATEGY,
    SolverError,
    SolveStop,
    ortools_missing,
    solve,
)
from rocm_assets_tests.helpers.placement import (
    FakeCost,
    FakeFleet,
    FakeNode,
    lpt_trap,
    make_problem,
    random_problem,
    seed_builds,
)

LIMIT_S = 5.0


def _check(problem: Problem, limit_s: float = LIMIT_S) -> None:
    result = solve(problem, limit_s, workers=1)
    schedule = result.schedule
    assert schedule.strategy == SOLVER_STRATEGY
    assert validate_schedule(problem, schedule) == []
    # Never worse than the heuristic plan it started from; never below any valid bound.
    assert schedule.makespan_s <= result.hint.makespan_s + 1e-6
    assert schedule.makespan_s >= lower_bounds(problem).best - 1e-6
    assert lower_bounds(problem).best - 1e-6 <= result.proven_bound_s <= schedule.makespan_s + 1e-6
    if result.status == "OPTIMAL":
        assert result.bound_s == result.objective_s and result.gap == 0.0


def test_solver_plans_validate_on_random_instances() -> None:
    # Random fleets (links over 25x) and DAGs, some inputs already placed or published, some
    # durations measured: everything the heuristics' tests cover, at a size CP-SAT proves.
    rng = random.Random(11)
    for _ in range(12):
        _check(random_problem(rng, max_nodes=4, max_targets=8))


def test_solver_plans_the_seed_graph_for_two_arches() -> None:
    nodes = (
        FakeNode("gaming", cores=16, mem_gb=15, link_mbps=100),
        FakeNode("think", cores=32, mem_gb=122, link_mbps=1000),
        FakeNode("nuc", cores=8, mem_gb=32, link_mbps=40),
    )
    costs = {
        "pytorch": FakeCost(7200, 6),
        "rocm-runtime": FakeCost(720, 8),
        "vllm": FakeCost(1320, 2),
    }
    builds, deps = seed_builds(["gfx942", "gfx1100"])
    _check(Problem(builds, deps, nodes, CostModel(FakeFleet(nodes, costs))), limit_s=10.0)


def _static_case(shape: str) -> Problem:
    """100 s builds, zero-size images, two equal nodes; each shape's best static bound is tight."""
    nodes = (FakeNode("n1"), FakeNode("n2"))
    if shape == "chain":
        builds = [Build(f"b{k}") for k in range(3)]
        deps = {b: frozenset(builds[k - 1 : k]) for k, b in enumerate(builds)}
    elif shape == "independent":
        deps = {Build(f"b{k}"): frozenset() for k in range(4)}
    else:
        neck = Build("neck")
        deps = {neck: frozenset()} | {Build(f"leaf{k}"): frozenset({neck}) for k in range(6)}
    return Problem(
        tuple(deps), deps, nodes, CostModel(FakeFleet(nodes, default=FakeCost(100, 0.0)))
    )


@pytest.mark.parametrize(
    ("shape", "source", "label", "value"),
    [
        # Three 100 s builds in a row: the critical path, 300 s, is the optimum.
        ("chain", "path", "static: critical path", 300.0),
        # Four independent builds on two nodes: the work bound, 200 s.
        ("independent", "work", "static: work", 200.0),
        # A neck then six leaves on two nodes: 100 + 600 / 2, the stage bound.
        ("neck", "stage", "static: stage", 400.0),
    ],
)
def test_best_bound_names_the_static_bound_when_the_solver_proves_no_more(
    shape: str, source: str, label: str, value: float
) -> None:
    problem = _static_case(shape)
    result = solve(problem, LIMIT_S, workers=1)
    assert result.status == "OPTIMAL"
    bound = best_bound(problem, result.proven_bound_s)
    assert (bound.source, bound.label) == (source, label)
    assert bound.value_s == pytest.approx(value, rel=1e-5) == lower_bounds(problem).best
    assert best_bound(problem) == bound


def test_best_bound_is_the_solvers_proof_when_it_is_tighter() -> None:
    # The seed graph for two arches: the static bounds miss how the nodes share the work.
    nodes = (
        FakeNode("gaming", cores=16, mem_gb=15, link_mbps=100),
        FakeNode("think", cores=32, mem_gb=122, link_mbps=1000),
        FakeNode("nuc", cores=8, mem_gb=32, link_mbps=40),
    )
    costs = {"pytorch": FakeCost(7200, 6), "vllm": FakeCost(1320, 2)}
    builds, deps = seed_builds(["gfx942", "gfx1100"])
    problem = Problem(builds, deps, nodes, CostModel(FakeFleet(nodes, costs)))
    result = solve(problem, 10.0, workers=1)
    static = lower_bounds(problem).best
    assert result.proven_bound_s > static + 60
    bound = best_bound(problem, result.proven_bound_s)
    assert bound == (result.proven_bound_s, "solver")
    assert bound.label == "proven by CP-SAT"
    assert bound.value_s <= result.schedule.makespan_s
    # Without the proof only the static bound is known, named.
    assert best_bound(problem).value_s == static and best_bound(problem).source != "solver"


def test_best_bound_is_the_makespan_exactly_when_it_reaches_it() -> None:
    # A static bound can meet a plan's makespan but for the last bits of float arithmetic (either
    # side): the plan is proven optimal all the same, so the bound reported is its makespan.
    rng = random.Random(1)
    noisy = 0
    for case in range(100):
        problem = random_problem(rng, max_nodes=3, max_targets=5)
        makespan = plan(problem, "default").makespan_s
        static = lower_bounds(problem)
        bound = best_bound(problem, makespan_s=makespan)
        if abs(static.best - makespan) <= 1e-6 * makespan:
            noisy += static.best != makespan
            assert bound == (makespan, static.best_source), case
        else:
            assert bound == best_bound(problem), case
    assert noisy, "no case of float noise: the test no longer covers it"


def test_solver_beats_a_poor_warm_start() -> None:
    # The seed's rule starts the side builds first (170 s); the optimum starts head at once (120 s).
    problem = lpt_trap()
    greedy = plan(problem, "greedy")
    result = solve(problem, LIMIT_S, workers=1, hint=greedy)
    assert greedy.makespan_s == pytest.approx(170, abs=0.1)
    assert result.status == "OPTIMAL" and not result.kept_hint
    assert result.schedule.makespan_s == pytest.approx(120, abs=0.1)
    assert validate_schedule(problem, result.schedule) == []


def test_solver_keeps_a_chain_on_one_node_to_save_the_pull() -> None:
    # a (100 s, 10 GB out) then b (100 s) on two equal 100 Mbit/s nodes: pulling a's image
    # elsewhere costs 800 s, so both go on one node; real (non-integer) seconds survive.
    nodes = (FakeNode("n1", link_mbps=100), FakeNode("n2", link_mbps=100))
    a, b = Build("a"), Build("b")
    costs = {"a": FakeCost(100.25, 10.0), "b": FakeCost(100.5, 0.0)}
    problem = make_problem(nodes, costs, {a: frozenset(), b: frozenset({a})})
    result = solve(problem, LIMIT_S, workers=1)
    by_build = {x.build: x for x in result.schedule.assignments}
    assert by_build[a].node == by_build[b].node
    assert result.schedule.makespan_s == pytest.approx(100.25 + 800 + 100.5)
    assert validate_schedule(problem, result.schedule) == []


def test_solver_waits_for_busy_nodes() -> None:
    nodes = (FakeNode("n1"), FakeNode("n2"))
    deps = {Build(f"b{k}"): frozenset() for k in range(4)}
    problem = make_problem(nodes, {}, deps)
    result = solve(problem, LIMIT_S, {"n1": 5000.0}, workers=1)
    assert all(a.start_s >= 5000.0 for a in result.schedule.assignments if a.node == "n1")
    assert validate_schedule(problem, result.schedule) == []


def test_solver_on_nothing_to_build() -> None:
    problem = make_problem((FakeNode("n1"),), {}, {})
    result = solve(problem, LIMIT_S, workers=1)
    assert result.schedule.assignments == () and result.schedule.makespan_s == 0.0


def test_missing_ortools_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes the import fail as if OR-Tools were not installed.
    monkeypatch.setitem(sys.modules, "ortools.sat.python", None)
    problem = make_problem((FakeNode("n1"),), {}, {Build("x"): frozenset()})
    with pytest.raises(SolverError, match=r"pip install 'ortools>=9.10'"):
        solve(problem, LIMIT_S)
    assert ortools_missing() == "the solver needs OR-Tools, a dependency of rocm_assets: " + (
        "pip install 'ortools>=9.10'"
    )


def test_ortools_is_there_when_installed() -> None:
    assert ortools_missing() is None


def test_a_deterministic_solve_reproduces() -> None:
    # Deterministic time and one interleaved worker: the same plan twice, whatever the load.
    rng = random.Random(21)
    for _ in range(3):
        problem = random_problem(rng, max_nodes=6, max_targets=14)
        hint = plan(problem, "greedy")
        first = solve(problem, 0.2, hint=hint, deterministic=True)
        again = solve(problem, 0.2, hint=hint, deterministic=True)
        assert first.schedule == again.schedule
        assert (first.status, first.objective_s) == (again.status, again.objective_s)
        assert validate_schedule(problem, first.schedule) == []


def test_a_stop_before_the_search_returns_the_warm_start() -> None:
    problem = lpt_trap()
    greedy = plan(problem, "greedy")
    stop = SolveStop()
    stop.stop()
    result = solve(problem, LIMIT_S, workers=1, hint=greedy, stop=stop)
    assert stop.stopped and result.kept_hint and result.status == "UNKNOWN"
    assert result.schedule.makespan_s == pytest.approx(greedy.makespan_s)
