"""Placement: cost model, strategies, lower bounds, schedule validation, the online decision.

No server is involved: placement is pure. Most cases use small local stand-ins with the
attribute names of rocm_assets.core.nodes.fleet (placement reads them through Protocols); one case loads the
shipped fleet.yaml through the real rocm_assets.core.nodes.fleet models and NodeProbe.
"""

import random
from dataclasses import replace
from pathlib import Path

import pytest

from rocm_assets.core.nodes.fleet import load_fleet
from rocm_assets.core.nodes.probes import NodeProbe
from rocm_assets.core.placement import (
    ALPHA,
    STRATEGIES,
    Assignment,
    Build,
    CostModel,
    PlacementError,
    Problem,
    choose_placements,
    lower_bounds,
    max_jobs,
    plan,
    validate_schedule,
)
from rocm_assets_tests.helpers.placement import (
    FakeCost,
    FakeFleet,
    FakeNode,
    FakeProbe,
    lpt_trap,
    make_problem,
    random_problem,
    seed_builds,
)


@pytest.mark.parametrize(
    ("cores", "mem_gb", "probe", "expected"),
    [
        # Plenty of RAM: cores cap the job count.
        (32, 122, None, 32),
        # The seed's 16-core / 15 GB box: memory caps it at floor(15 / 2) = 7.
        (16, 15, None, 7),
        # Odd GB round down.
        (64, 9, None, 4),
        # Almost no memory still gives one job.
        (4, 1, None, 1),
        # A probe's MemAvailable replaces the manifest's figure: 21 GB free gives 10.
        (32, 122, FakeProbe("n", mem_available_gb=21), 10),
        # A probe's core count replaces the manifest's.
        (32, 122, FakeProbe("n", cores=8), 8),
        # A failed probe is ignored: the manifest's figures stand.
        (32, 122, FakeProbe("n", ok=False, reason="timeout", mem_available_gb=3, cores=2), 32),
    ],
)
def test_max_jobs_from_memory_and_cores(
    cores: int, mem_gb: float, probe: FakeProbe | None, expected: int
) -> None:
    assert max_jobs(FakeNode("n", cores=cores, mem_gb=mem_gb), probe) == expected


def test_probe_of_another_node_is_refused() -> None:
    with pytest.raises(PlacementError, match="probe of node 'm' given for node 'n'"):
        max_jobs(FakeNode("n"), FakeProbe("m"))


@pytest.mark.parametrize(
    ("node", "factor"),
    [
        # Same job count as the reference (32): the table's seconds.
        (FakeNode("ref", cores=32, mem_gb=122), 1.0),
        # Half the jobs: (32/16) ** ALPHA times as long.
        (FakeNode("half", cores=16, mem_gb=122), 2**ALPHA),
        # Memory-bound 16c/15GB box: 7 jobs.
        (FakeNode("tight", cores=16, mem_gb=15), (32 / 7) ** ALPHA),
        # Twice the jobs: faster by the same law.
        (FakeNode("big", cores=64, mem_gb=256), 0.5**ALPHA),
    ],
)
def test_build_seconds_scale_with_job_count(node: FakeNode, factor: float) -> None:
    cost = CostModel(FakeFleet((node,), {"pytorch": FakeCost(7200, 6)}))
    assert cost.build_s("pytorch", node) == pytest.approx(7200 * factor)


def test_measured_duration_replaces_estimate_for_its_job_count() -> None:
    node = FakeNode("n", cores=32, mem_gb=122)
    fleet = FakeFleet((node,), {"pytorch": FakeCost(7200, 6)})
    measured = {("pytorch", "n", 32): 5000.0}
    # Measured at 32 jobs, planned at 32 jobs: the measurement is used.
    assert CostModel(fleet, measured=measured).build_s("pytorch", node) == 5000.0
    # A probe showing 21 GB free gives 10 jobs: the measurement, not the table, predicts it
    # by the job-count law.
    probed = CostModel(fleet, probes=[FakeProbe("n", mem_available_gb=21)], measured=measured)
    assert probed.build_s("pytorch", node) == pytest.approx(5000 * (32 / 10) ** ALPHA)
    # Another target keeps its table estimate.
    assert CostModel(fleet, measured=measured).build_s("vllm", node) == pytest.approx(600)


def test_a_target_measured_on_one_node_predicts_it_on_another() -> None:
    # Reference 32 jobs; big runs 32, small 8 (16 GB), tight 4 (8 GB).
    big = FakeNode("big", cores=32, mem_gb=122)
    small = FakeNode("small", cores=16, mem_gb=16)
    tight = FakeNode("tight", cores=16, mem_gb=8)
    fleet = FakeFleet((big, small, tight), {"pytorch": FakeCost(7200, 6)})
    # Two samples: 4000 s at 32 jobs and 9000 s at 8 jobs, i.e. 4000 and 9000 * (8/32)**ALPHA
    # at the reference; the median of the two stands in for the table's 7200 s.
    measured = {("pytorch", "big", 32): 4000.0, ("pytorch", "small", 8): 9000.0}
    cost = CostModel(fleet, measured=measured)
    at_ref = (4000 + 9000 * (8 / 32) ** ALPHA) / 2
    assert cost.build_s("pytorch", tight) == pytest.approx(at_ref * (32 / 4) ** ALPHA)
    # The exact samples still win on their own node and job count.
    assert cost.build_s("pytorch", big) == 4000.0
    assert cost.build_s("pytorch", small) == 9000.0


def test_prediction_improves_as_measurements_arrive() -> None:
    # The truth: the target takes 3000 s at the reference's 32 jobs, not the table's 7200, and
    # the slow node is 10% slower than the job-count law says (the law is a model, not a fact).
    fast = FakeNode("fast", cores=32, mem_gb=122)
    slow = FakeNode("slow", cores=16, mem_gb=20)
    fleet = FakeFleet((fast, slow), {"aiter-wheel": FakeCost(7200, 1)})
    j_slow = max_jobs(slow)
    true_fast, true_slow = 3000.0, 3000.0 * (32 / j_slow) ** ALPHA * 1.1

    def error(measured: dict[tuple[str, str, int], float]) -> float:
        predicted = CostModel(fleet, measured=measured).build_s("aiter-wheel", slow)
        return abs(predicted - true_slow) / true_slow

    none = error({})
    elsewhere = error({("aiter-wheel", "fast", 32): true_fast})
    here = error(
        {("aiter-wheel", "fast", 32): true_fast, ("aiter-wheel", "slow", j_slow): true_slow}
    )
    assert none > 1.0  # the table's 7200 s: more than twice the truth
    assert elsewhere == pytest.approx(1 - 1 / 1.1)  # only the law's own 10% is left
    assert here == 0.0
    assert none > elsewhere > here


def _duration_on(node: FakeNode, fleet: FakeFleet, pushed: dict[Build, str]) -> float:
    a, b = Build("a", "gfx942"), Build("b", "gfx942")
    decision = choose_placements(
        [b], {}, [node], CostModel(fleet), 0.0, {b: frozenset({a})}, pushed, "critical-path"
    )
    (start,) = decision.starts
    return start.est_finish_s - start.est_start_s


def test_transfers_push_and_pull_only_across_nodes() -> None:
    n1 = FakeNode("n1", link_mbps=100)
    n2 = FakeNode("n2", link_mbps=1000)
    fleet = FakeFleet((n1, n2), {"a": FakeCost(100, 4.0), "b": FakeCost(50, 2.0)})
    cost = CostModel(fleet)
    a = Build("a", "gfx942")
    # Push is size over uplink: 2 GB at 100 Mbit/s.
    assert cost.push_s("b", n1) == pytest.approx(2 * 8000 / 100)
    # b on n1, where a was built: no pull, just build and push.
    assert _duration_on(n1, fleet, {a: "n1"}) == pytest.approx(50 + 2 * 8000 / 100)
    # b on n2, a built on n1: pull a's 4 GB at n2's link first.
    assert _duration_on(n2, fleet, {a: "n1"}) == pytest.approx(
        4 * 8000 / 1000 + 50 + 2 * 8000 / 1000
    )
    # a outside the request and not placed: published, pulled from the registry anywhere.
    assert _duration_on(n1, fleet, {}) == pytest.approx(4 * 8000 / 100 + 50 + 2 * 8000 / 100)


def _placement(assignments: tuple[Assignment, ...], build: Build) -> tuple[str, float, float]:
    (a,) = [a for a in assignments if a.build == build]
    return a.node, a.start_s, a.end_s


def test_greedy_sends_to_soonest_finish_not_least_loaded() -> None:
    # The least loaded box by the seed's score (free GB + idle cores) has a 40 Mbit/s uplink;
    # the small one 1000 (a 25x spread). A 10 GB image finishes sooner on the small one:
    # 600 s * (32/7)^0.8 + 80 s push there, against 600 s + 2000 s push on the big one.
    big = FakeNode("big", cores=32, mem_gb=122, link_mbps=40)
    small = FakeNode("small", cores=16, mem_gb=15, link_mbps=1000)
    x = Build("x", "gfx942")
    schedule = plan(
        make_problem((big, small), {"x": FakeCost(600, 10)}, {x: frozenset()}), "greedy"
    )
    node, start, end = _placement(schedule.assignments, x)
    assert (node, start) == ("small", 0.0)
    assert end == pytest.approx(600 * (32 / 7) ** ALPHA + 80)


def test_greedy_gives_the_longest_eligible_build_first_choice() -> None:
    # Both builds finish soonest on "fast"; the longer one (by reference seconds) gets it and the
    # shorter takes the free slow node at once, one build per node.
    fast = FakeNode("fast", cores=32)
    slow = FakeNode("slow", cores=8)
    long_, short = Build("long"), Build("short")
    costs = {"long": FakeCost(3000, 0.1), "short": FakeCost(300, 0.1)}
    schedule = plan(
        make_problem((fast, slow), costs, {long_: frozenset(), short: frozenset()}), "greedy"
    )
    assert _placement(schedule.assignments, long_)[:2] == ("fast", 0.0)
    assert _placement(schedule.assignments, short)[:2] == ("slow", 0.0)


def test_greedy_uses_a_free_node_rather_than_wait_for_a_faster_one() -> None:
    # One build per node, free nodes only: a (1000 s) takes "fast", b (180 s, 950 s at 4 jobs)
    # takes "slow". When slow frees at 950, c starts there (ends 1478) although fast, free at
    # 1000, would end it at 1100. Earliest-finish placement over all nodes waits for fast.
    fast = FakeNode("fast", cores=32)
    slow = FakeNode("slow", cores=4)
    a, b, c = Build("a"), Build("b"), Build("c")
    costs = {"a": FakeCost(1000, 0.0), "b": FakeCost(180, 0.0), "c": FakeCost(100, 0.0)}
    problem = make_problem((fast, slow), costs, {a: frozenset(), b: frozenset(), c: frozenset()})
    schedule = plan(problem, "greedy")
    assert _placement(schedule.assignments, a)[:2] == ("fast", 0.0)
    b_node, _, b_end = _placement(schedule.assignments, b)
    assert (b_node, b_end) == ("slow", pytest.approx(180 * 8**ALPHA))
    assert _placement(schedule.assignments, c)[:2] == ("slow", b_end)
    assert _placement(plan(problem, "critical-path").assignments, c)[:3] == ("fast", 1000.0, 1100.0)
    assert validate_schedule(problem, schedule) == []


def test_critical_path_beats_greedy_when_lpt_starts_side_targets_first() -> None:
    problem = lpt_trap()
    lpt = plan(problem, "greedy")
    ranked = plan(problem, "critical-path")
    assert lpt.makespan_s == pytest.approx(170, abs=0.1)
    assert ranked.makespan_s == pytest.approx(120, abs=0.1)
    best = plan(problem)
    assert best.strategy in {"default(critical-path)", "default(peft)"}
    assert best.makespan_s == pytest.approx(120, abs=0.1)


@pytest.mark.parametrize(
    ("deps", "nodes", "expected"),
    [
        # A chain of three 100 s builds: the path bound is their sum, and it is reached.
        ("chain", 2, 300.0),
        # Four independent 100 s builds on two equal nodes: the work bound, 200 s, is reached.
        ("independent", 2, 200.0),
    ],
)
def test_lower_bound_is_tight_on_simple_cases(deps: str, nodes: int, expected: float) -> None:
    fleet_nodes = tuple(FakeNode(f"n{p}") for p in range(nodes))
    builds = [Build(f"b{k}") for k in range(3 if deps == "chain" else 4)]
    graph = {
        b: frozenset({builds[k - 1]}) if deps == "chain" and k else frozenset()
        for k, b in enumerate(builds)
    }
    # Zero-size images keep transfers out of the arithmetic.
    fleet = FakeFleet(fleet_nodes, default=FakeCost(100, 0.0))
    problem = Problem(tuple(builds), graph, fleet_nodes, CostModel(fleet))
    assert lower_bounds(problem).best == pytest.approx(expected, rel=1e-5)
    assert plan(problem).makespan_s == pytest.approx(expected)


def test_stage_bound_counts_work_below_the_neck() -> None:
    # A 100 s neck, then six 100 s leaves on two nodes: 100 + 600 / 2 = 400 s. Path gives 200,
    # the plain work bound 350; only the stage bound sees 400.
    nodes = (FakeNode("n1"), FakeNode("n2"))
    neck = Build("neck")
    leaves = [Build(f"leaf{k}") for k in range(6)]
    deps = {neck: frozenset()} | {leaf: frozenset({neck}) for leaf in leaves}
    problem = Problem(
        tuple(deps), deps, nodes, CostModel(FakeFleet(nodes, default=FakeCost(100, 0.0)))
    )
    bounds = lower_bounds(problem)
    assert bounds.path_s == pytest.approx(200)
    assert bounds.stage_s == pytest.approx(400)
    assert bounds.best == pytest.approx(400)
    assert plan(problem).makespan_s == pytest.approx(400)


def test_busy_nodes_take_nothing_before_they_free() -> None:
    nodes = (FakeNode("n1"), FakeNode("n2"))
    deps = {Build(f"b{k}"): frozenset() for k in range(4)}
    problem = make_problem(nodes, {}, deps)
    for name in STRATEGIES:
        schedule = plan(problem, name, busy_until={"n1": 5000.0})
        assert all(a.start_s >= 5000.0 for a in schedule.assignments if a.node == "n1"), name
        assert validate_schedule(problem, schedule) == [], name


def test_seed_graph_on_a_skewed_fleet_is_valid_for_every_strategy() -> None:
    # The seed's complaint: a 16c/15GB box beside a 32c/122GB one, plus links 40..1000 Mbit/s.
    nodes = (
        FakeNode("snoc-gaming", cores=16, mem_gb=15, link_mbps=1000),
        FakeNode("snoc-think", cores=32, mem_gb=122, link_mbps=1000),
        FakeNode("slow-link", cores=32, mem_gb=122, link_mbps=40),
    )
    costs = {
        "pytorch": FakeCost(7200, 6),
        "rocm-runtime": FakeCost(600, 10),
        "vllm": FakeCost(1200, 3),
    }
    builds, deps = seed_builds(["gfx942", "gfx1100"])
    problem = Problem(builds, deps, nodes, CostModel(FakeFleet(nodes, costs)))
    greedy_span = plan(problem, "greedy").makespan_s
    for name in STRATEGIES:
        schedule = plan(problem, name)
        assert validate_schedule(problem, schedule) == [], name
        assert len(schedule.assignments) == len(builds)
    assert plan(problem).makespan_s <= greedy_span + 1e-6


def test_default_never_worse_than_greedy_and_every_plan_valid_on_random_instances() -> None:
    rng = random.Random(20240517)
    for case in range(300):
        problem = random_problem(rng)
        schedules = {name: plan(problem, name) for name in STRATEGIES}
        for name, schedule in schedules.items():
            assert validate_schedule(problem, schedule) == [], (case, name)
            assert schedule.lower_bound_s <= schedule.makespan_s + 1e-6, (case, name)
        best = min(schedules[h].makespan_s for h in ("greedy", "critical-path", "peft"))
        assert schedules["default"].makespan_s == pytest.approx(best), case
        assert schedules["default"].makespan_s <= schedules["greedy"].makespan_s + 1e-6, case


def test_validate_schedule_reports_each_fault() -> None:
    nodes = (FakeNode("n1"), FakeNode("n2"))
    a, b, c = Build("a"), Build("b"), Build("c")
    deps = {a: frozenset(), b: frozenset({a}), c: frozenset()}
    problem = make_problem(nodes, {}, deps)
    good = plan(problem, "critical-path")
    assert validate_schedule(problem, good) == []
    at = {x.build: x for x in good.assignments}
    length = {x.build: x.end_s - x.start_s for x in good.assignments}
    cases = [
        # A build left out.
        ((at[a], at[b]), "c is not scheduled"),
        # A build twice.
        ((*good.assignments, at[c]), "c is scheduled twice"),
        # An unknown node.
        ((at[a], at[b], Assignment(c, "n9", 0.0, 1.0)), "unknown node 'n9'"),
        # b moved to start before a's push ends.
        (
            (at[a], replace(at[b], start_s=0.0, end_s=length[b]), at[c]),
            "before its inputs are pushed",
        ),
        # c given half the time the cost model says it takes.
        (
            (at[a], at[b], replace(at[c], end_s=at[c].start_s + length[c] / 2)),
            "the cost model says",
        ),
        # a and c on one node at once.
        (
            (
                replace(at[a], node="n1"),
                at[b],
                replace(at[c], node="n1", start_s=0.0, end_s=length[c]),
            ),
            "overlap on n1",
        ),
    ]
    for assignments, message in cases:
        broken = replace(good, assignments=assignments)
        assert any(message in e for e in validate_schedule(problem, broken)), message
    # A makespan that is not the last end, and one below the lower bound.
    errors = validate_schedule(problem, replace(good, makespan_s=1.0))
    assert any("is not the last end" in e for e in errors)
    assert any("below the lower bound" in e for e in errors)


@pytest.mark.parametrize(
    ("deps", "strategy", "message"),
    [
        # A cycle names its builds.
        (
            {Build("x"): frozenset({Build("y")}), Build("y"): frozenset({Build("x")})},
            "default",
            "cycle among builds: x, y",
        ),
        # A self-dependency.
        ({Build("x"): frozenset({Build("x")})}, "default", "x depends on itself"),
        # An unknown strategy lists the known ones.
        ({Build("x"): frozenset()}, "fastest", "unknown placement strategy 'fastest'"),
    ],
)
def test_bad_problems_raise_one_clear_error(
    deps: dict[Build, frozenset[Build]], strategy: str, message: str
) -> None:
    with pytest.raises(PlacementError, match=message):
        plan(make_problem((FakeNode("n1"),), {}, deps), strategy)


def test_no_nodes_and_duplicate_nodes_are_refused() -> None:
    deps = {Build("x"): frozenset()}
    with pytest.raises(PlacementError, match="no usable build node"):
        plan(make_problem((), {}, deps))
    with pytest.raises(PlacementError, match="node names repeat"):
        plan(make_problem((FakeNode("n1"), FakeNode("n1")), {}, deps))
    # Online, every node excluded is a reason to wait, not an error in the daemon.
    cost = CostModel(FakeFleet(()))
    decision = choose_placements(list(deps), {}, [], cost, 0.0, deps)
    assert decision.starts == ()
    assert decision.waiting[Build("x")].reason == "no usable build node"


def test_build_names_and_order() -> None:
    assert str(Build("pytorch", "gfx942")) == "pytorch@gfx942"
    assert str(Build("triton-wheel")) == "triton-wheel"
    # A noarch build sorts before the same target's arch builds, without comparing None to str.
    assert sorted([Build("t", "gfx942"), Build("t"), Build("a", "gfx90a")]) == [
        Build("a", "gfx90a"),
        Build("t"),
        Build("t", "gfx942"),
    ]


def test_choose_placements_hand_case() -> None:
    # n1 runs pytorch until t=1000; n2 and n3 are free. torchvision and aiter need pytorch and
    # wait; triton's input is pushed, so it starts now; only one node takes it.
    nodes = [FakeNode("n1"), FakeNode("n2"), FakeNode("n3", cores=8)]
    pt, tv, ai, tr, base = (
        Build(t, "gfx942") for t in ("pytorch", "torchvision", "aiter", "triton", "base")
    )
    deps = {
        tv: frozenset({pt}),
        ai: frozenset({pt, tr}),
        tr: frozenset({base}),
        pt: frozenset({base}),
    }
    cost = CostModel(FakeFleet(tuple(nodes)))
    decision = choose_placements(
        [tv, ai, tr], {pt: ("n1", 1000.0)}, nodes, cost, 10.0, deps, {base: "n2"}
    )
    assert [(s.build, s.node, s.est_start_s) for s in decision.starts] == [(tr, "n2", 10.0)]
    assert decision.waiting[tv].deps == (pt,)
    assert decision.waiting[ai].deps == (pt, tr)
    assert decision.waiting[tv].reason == "waits for pytorch@gfx942"


@pytest.mark.parametrize(
    ("strategy", "nodes", "started_on", "reason"),
    [
        # fast frees in 10 s and finishes c at +110 s; slow (4 jobs) would take 528 s: the plan
        # holds c for fast and leaves slow idle.
        (
            "critical-path",
            ("fast", "slow"),
            None,
            "held for fast, the soonest finish (planned on fast at +10s)",
        ),
        # The seed's rule uses the free node now.
        ("greedy", ("fast", "slow"), "slow", None),
        # Only fast exists and it is busy.
        ("critical-path", ("fast",), None, "no free node (planned on fast at +10s)"),
    ],
)
def test_choose_placements_holds_for_a_sooner_node(
    strategy: str, nodes: tuple[str, ...], started_on: str | None, reason: str | None
) -> None:
    fleet_nodes = [FakeNode("fast", cores=32), FakeNode("slow", cores=4)]
    usable = [n for n in fleet_nodes if n.name in nodes]
    c, x = Build("c"), Build("x")
    cost = CostModel(FakeFleet(tuple(fleet_nodes), default=FakeCost(100, 0.0)))
    decision = choose_placements([c], {x: ("fast", 1010.0)}, usable, cost, 1000.0, {}, {}, strategy)
    assert [s.node for s in decision.starts] == ([started_on] if started_on else [])
    if reason is not None:
        assert decision.waiting[c].reason == reason
        assert decision.waiting[c].est_start_s == pytest.approx(1010.0)


def test_choose_placements_greedy_is_the_first_step_of_the_greedy_plan() -> None:
    rng = random.Random(7)
    for _ in range(50):
        problem = random_problem(rng)
        fresh = Problem(problem.builds, problem.deps, problem.nodes, problem.cost)
        for strategy in ("greedy", "critical-path"):
            schedule = plan(fresh, strategy)
            now = [(a.build, a.node) for a in schedule.assignments if a.start_s == 0.0]
            decision = choose_placements(
                fresh.builds, {}, fresh.nodes, fresh.cost, 0.0, fresh.deps, {}, strategy
            )
            assert sorted((s.build, s.node) for s in decision.starts) == sorted(now), strategy


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_choose_placements_one_per_free_node_and_only_eligible(strategy: str) -> None:
    rng = random.Random(99)
    for case in range(60):
        problem = random_problem(rng)
        builds = list(problem.builds)
        rng.shuffle(builds)
        # Some builds finished (pushed), some running on distinct nodes, the rest pending.
        running: dict[Build, tuple[str, float]] = {}
        pushed: dict[Build, str] = {}
        nodes = [n.name for n in problem.nodes]
        rng.shuffle(nodes)
        pending = set(problem.builds)
        for b in builds:
            if (
                all(d not in pending or d in pushed for d in problem.deps.get(b, ()))
                and rng.random() < 0.3
            ):
                pushed[b] = rng.choice(nodes)
                pending.discard(b)
        for b in builds:
            if b in pending and nodes and rng.random() < 0.2:
                running[b] = (nodes.pop(), rng.uniform(0, 5000))
                pending.discard(b)
        decision = choose_placements(
            pending, running, problem.nodes, problem.cost, 100.0, problem.deps, pushed, strategy
        )
        started_nodes = [s.node for s in decision.starts]
        assert len(started_nodes) == len(set(started_nodes)), case
        busy = {node for node, _ in running.values()}
        assert not busy & set(started_nodes), case
        unfinished = pending | running.keys()
        for s in decision.starts:
            assert s.build in pending, case
            assert not problem.deps.get(s.build, frozenset()) & unfinished, (case, s.build)
            assert s.est_start_s == 100.0 and s.est_finish_s > s.est_start_s, case
        started = {s.build for s in decision.starts}
        assert started | decision.waiting.keys() == pending, case
        assert not started & decision.waiting.keys(), case
        for b, wait in decision.waiting.items():
            assert wait.deps == tuple(sorted(problem.deps.get(b, frozenset()) & unfinished)), case


def test_shipped_fleet_and_real_probes_fit_the_protocols(project_root: Path) -> None:
    # rocm_assets.core.nodes.fleet's pydantic nodes and NodeProbe dataclass, as the coordinator passes them.
    fleet = load_fleet(project_root / "fleet.yaml")
    first, second = fleet.nodes[0], fleet.nodes[1]
    tight = NodeProbe(first.name, True, None, 21.0, first.cores, 4.0, True, 0.0)
    down = NodeProbe(second.name, False, "ssh: timed out", 0.0, 0, 0.0, False, 0.0)
    cost = CostModel(fleet, probes=[tight, down])
    # The live probe sets MAX_JOBS; the failed one leaves the manifest's figures.
    assert cost.max_jobs(first) == min(first.cores, 10)
    assert cost.max_jobs(second) == max_jobs(second)
    builds, deps = seed_builds(["gfx942", "gfx1100"])
    problem = Problem(builds, deps, fleet.nodes, cost)
    for name in STRATEGIES:
        assert validate_schedule(problem, plan(problem, name)) == [], name
