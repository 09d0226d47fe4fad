"""An exact placement plan from OR-Tools CP-SAT, warm-started from the best list-scheduling plan.

Pure (no Dagster, no I/O); OR-Tools (a dependency) is imported only when `solve` runs, so a
broken install costs the solver, not placement: `ortools_missing` says why.
It plans the same `placement.Problem` the heuristics do, with the same cost model:

- every build i gets a start s_i and an end e_i, and an optional interval on every node p whose
  presence x[i,p] says "i runs on p" (exactly one per build);
- NoOverlap per node: one build per node at a time; a node busy until t (a placed build, the
  caller's `busy_until`) holds a fixed interval [0, t);
- the interval's size is the cost model's occupancy (build + own push + registry pulls) plus,
  for each input k built in the request, the pull of k when k is not on p:
      size[i,p] = occ(i,p) + fixed pulls(i,p) + sum_k pull(k,p) * (1 - x[k,p])
  x[k,p] is the reified "k is on the same node" boolean, so no extra variables are needed;
- s_i >= e_k for every input k (its push has ended), s_i >= the end of placed inputs;
- minimise the makespan, which is at least every end and at least `placement.lower_bounds`.

Times are integer seconds with every duration rounded up, so the model never promises more
than the real costs allow. Its best solution keeps only the node and per-node order: the
returned `Schedule` recomputes the times with the exact (real) costs, so `validate_schedule`
accepts it, and its makespan is at most the integer one. The hint's plan is kept when it is
still shorter in real seconds, so the result is never worse than the best heuristic.

`SolveResult.proven_bound_s` is a valid lower bound in real seconds: the solver's bound minus
the rounding it may have added (sum over builds of the largest rounding of that build on any
node), and never below the heuristic lower bound; it is the plan's makespan exactly when it
reaches it. So CP-SAT's OPTIMAL proves the plan optimal only when `real_gap` is 0.
"""

import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Submodules, not the package: the package's follower imports this module.
from rocm_assets.core.placement.bounds import lower_bounds, reaches
from rocm_assets.core.placement.heuristics import plan
from rocm_assets.core.placement.problem import Assignment, Problem, Schedule, left_shift

SOLVER_STRATEGY = "solver"
DEFAULT_TIME_LIMIT_S = 10.0
# A deterministic solve also gets a wall-clock cap, far enough out that only a stalled machine
# reaches it (then the run is no longer reproducible, but it ends).
_WALL_CAP_FACTOR = 20.0
_WALL_CAP_MIN_S = 30.0
_MISSING = "the solver needs OR-Tools, a dependency of rocm_assets: pip install 'ortools>=9.10'"


class SolverError(RuntimeError):
    """The solver cannot run (OR-Tools missing); the message says what to install."""


def ortools_missing() -> str | None:
    """Why CP-SAT cannot run here (one line), or None when it can."""
    try:
        from ortools.sat.python import cp_model  # noqa: F401
    except ImportError:
        return _MISSING
    return None


class SolveStop:
    """Stops a solve from another thread; the solve then returns the best plan found so far.

    A stop before the search starts skips it (the warm start is returned).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._solver: Any = None
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._solver is not None:
                self._solver.stop_search()

    def attach(self, solver: Any) -> bool:
        """Called by `solve` before searching: False when already stopped."""
        with self._lock:
            self._solver = solver
            return not self._stopped

    def detach(self) -> None:
        with self._lock:
            self._solver = None


@dataclass(frozen=True)
class SolveResult:
    """A CP-SAT plan and what the solver proved about it.

    `status` is CP-SAT's (OPTIMAL, FEASIBLE, UNKNOWN); `objective_s` and `bound_s` are the
    integer model's best makespan and proven bound; `proven_bound_s` is a lower bound on any
    plan's real makespan; `hint` is the heuristic plan it started from, and `kept_hint` says the
    hint was returned because the solver found nothing shorter in real seconds.
    """

    schedule: Schedule
    status: str
    objective_s: float
    bound_s: float
    proven_bound_s: float
    hint: Schedule
    kept_hint: bool
    wall_s: float
    time_limit_s: float

    @property
    def gap(self) -> float:
        """(objective - bound) / objective of the integer model: 0 when CP-SAT proved it optimal,
        which can happen before the plan is proven optimal in real seconds (`real_gap`)."""
        return (
            0.0 if self.objective_s <= 0 else (self.objective_s - self.bound_s) / self.objective_s
        )

    @property
    def real_gap(self) -> float:
        """(makespan - proven bound) / makespan of the plan in real seconds: 0 exactly when it is
        proven optimal. The model's durations are rounded up, so its optimum leaves up to the
        rounding unproven."""
        makespan = self.schedule.makespan_s
        return 0.0 if makespan <= 0 else (makespan - self.proven_bound_s) / makespan

    @property
    def summary(self) -> str:
        """CP-SAT's status and `real_gap`, as `plan` and the coordinator report them."""
        status = self.status
        if status == "OPTIMAL" and self.real_gap > 0:
            status = "OPTIMAL in whole seconds"
        return f"{status}, gap {100 * self.real_gap:.1f}%"


def _ceil(x: float) -> int:
    # 1e-9 absorbs float noise (2.0000000001 s is 2 s), far below the rounding it may hide.
    return max(0, math.ceil(x - 1e-9))


def _schedule(
    problem: Problem,
    strategy: str,
    node_of: Sequence[int],
    order: Sequence[int],
    avail0: Sequence[float],
) -> Schedule:
    ix = problem.index
    _, start, end = left_shift(ix, node_of, order, avail0)
    assignments = sorted(
        (
            Assignment(ix.builds[i], ix.names[node_of[i]], start[i], end[i])
            for i in range(len(ix.builds))
        ),
        key=lambda a: (a.start_s, a.node, a.build),
    )
    return Schedule(strategy, tuple(assignments), max(end, default=0.0), lower_bounds(problem).best)


def _order_of(schedule: Schedule, problem: Problem) -> tuple[list[int], list[int]]:
    """A plan's node per build and a dependency-respecting order (by start, then end)."""
    ix = problem.index
    node_pos = {name: p for p, name in enumerate(ix.names)}
    node_of = [0] * len(ix.builds)
    topo_pos = {i: k for k, i in enumerate(ix.topo)}
    keyed = []
    for a in schedule.assignments:
        i = ix.pos[a.build]
        node_of[i] = node_pos[a.node]
        keyed.append((a.start_s, a.end_s, topo_pos[i], i))
    return node_of, [i for *_, i in sorted(keyed)]


def solve(
    problem: Problem,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    busy_until: Mapping[str, float] | None = None,
    *,
    workers: int | None = None,
    hint: Schedule | None = None,
    deterministic: bool = False,
    stop: SolveStop | None = None,
) -> SolveResult:
    """Plan every build of `problem` with CP-SAT within `time_limit_s` of solving.

    Args:
        problem: the builds, deps, nodes and cost model, as for `placement.plan`.
        time_limit_s: CP-SAT's wall-clock limit; the best plan found by then is returned.
        busy_until: seconds from now until a node is free, as for `placement.plan`.
        workers: CP-SAT search workers (default: the machine's cores, at most 8; 1 when
            `deterministic`).
        hint: the warm start (default: `plan(problem, "default")`, the best heuristic plan).
        deterministic: `time_limit_s` is CP-SAT's deterministic time (work counted, not
            seconds elapsed) and the search is interleaved, so the same problem gives the same
            plan on any machine and under any load.
        stop: lets another thread end the search early.

    Raises:
        SolverError: OR-Tools is not installed.
        PlacementError: the problem itself is invalid (as `placement.plan` raises).
    """
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        raise SolverError(_MISSING) from None
    started = time.perf_counter()
    busy = dict(busy_until or {})
    ix = problem.index
    if hint is None:
        hint = plan(problem, "default", busy)
    avail0 = ix.avail(busy)
    n, m = len(ix.builds), len(ix.names)
    bound = lower_bounds(problem).best
    if n == 0:
        empty = Schedule(SOLVER_STRATEGY, (), 0.0, bound)
        return SolveResult(empty, "OPTIMAL", 0.0, 0.0, 0.0, hint, False, 0.0, time_limit_s)

    inv = ix.inv_link
    # exact[i][p]: occupancy on p when every input built in the request is on p too (fixed
    # inputs already on p cost nothing, as in the cost model); base is it rounded up.
    exact = [
        [
            ix.full[i][p]
            - (sum(ix.size[k] for k in ix.preds[i]) + ix.fixed_local[i].get(p, 0.0)) * inv[p]
            for p in range(m)
        ]
        for i in range(n)
    ]
    base = [[_ceil(x) for x in row] for row in exact]
    pull = [[_ceil(ix.size[k] * inv[p]) for p in range(m)] for k in range(n)]
    avail_int = [_ceil(a) for a in avail0]
    ready_int = [_ceil(r) for r in ix.fixed_ready]

    # Largest rounding a build can carry on any node, summed: what the integer optimum may
    # exceed the real optimum by, and so what the proven bound gives back.
    slack = sum(
        max(
            base[i][p] - exact[i][p] + sum(pull[k][p] - ix.size[k] * inv[p] for k in ix.preds[i])
            for p in range(m)
        )
        for i in range(n)
    )
    if any(a > 0 for a in avail0) or any(r > 0 for r in ix.fixed_ready):
        slack += 1.0

    # The hint in integer time: same nodes and order, rounded durations.
    hint_nodes, hint_order = _order_of(hint, problem)
    hs, he = [0] * n, [0] * n
    free_at = list(avail_int)
    for i in hint_order:
        p = hint_nodes[i]
        size = base[i][p] + sum(pull[k][p] for k in ix.preds[i] if hint_nodes[k] != p)
        hs[i] = max([free_at[p], ready_int[i], *(he[k] for k in ix.preds[i])])
        he[i] = hs[i] + size
        free_at[p] = he[i]
    hint_makespan = max(he)

    horizon = hint_makespan
    model = cp_model.CpModel()
    start = [model.NewIntVar(0, horizon, f"s{i}") for i in range(n)]
    end = [model.NewIntVar(0, horizon, f"e{i}") for i in range(n)]
    on = [[model.NewBoolVar(f"x{i}_{p}") for p in range(m)] for i in range(n)]
    per_node: list[list[Any]] = [[] for _ in range(m)]
    sizes: dict[tuple[int, int], Any] = {}
    for i in range(n):
        model.AddExactlyOne(on[i])
        model.Add(start[i] >= ready_int[i])
        for p in range(m):
            top = base[i][p] + sum(pull[k][p] for k in ix.preds[i])
            size = model.NewIntVar(base[i][p], top, f"d{i}_{p}")
            model.Add(size == base[i][p] + sum(pull[k][p] * (1 - on[k][p]) for k in ix.preds[i]))
            sizes[i, p] = size
            per_node[p].append(
                model.NewOptionalIntervalVar(start[i], size, end[i], on[i][p], f"i{i}_{p}")
            )
        for k in ix.preds[i]:
            model.Add(start[i] >= end[k])
    for p in range(m):
        if avail_int[p] > 0:
            per_node[p].append(model.NewFixedSizeIntervalVar(0, avail_int[p], f"busy{p}"))
        model.AddNoOverlap(per_node[p])
    makespan = model.NewIntVar(_ceil(bound - 1e-6 * max(1.0, bound)), horizon, "makespan")
    model.AddMaxEquality(makespan, end)
    # Redundant for the model, useful to the relaxation: a node's own work fits in the makespan.
    for p in range(m):
        model.Add(sum(base[i][p] * on[i][p] for i in range(n)) + avail_int[p] <= makespan)
    model.Minimize(makespan)

    for i in range(n):
        model.AddHint(start[i], hs[i])
        model.AddHint(end[i], he[i])
        for p in range(m):
            model.AddHint(on[i][p], p == hint_nodes[i])
            model.AddHint(
                sizes[i, p],
                base[i][p] + sum(pull[k][p] for k in ix.preds[i] if hint_nodes[k] != p),
            )
    model.AddHint(makespan, hint_makespan)

    solver = cp_model.CpSolver()
    limit = max(0.01, float(time_limit_s))
    if deterministic:
        solver.parameters.max_deterministic_time = limit
        solver.parameters.max_time_in_seconds = max(_WALL_CAP_MIN_S, _WALL_CAP_FACTOR * limit)
        solver.parameters.num_workers = workers or 1
        solver.parameters.interleave_search = True
    else:
        solver.parameters.max_time_in_seconds = limit
        solver.parameters.num_workers = workers or min(8, os.cpu_count() or 1)
    # Presolve may otherwise reduce the model past the hinted solution, and the search then
    # starts cold: on 50 builds it found nothing at all in 20 s with the hint in hand.
    solver.parameters.keep_all_feasible_solutions_in_presolve = True
    if stop is None or stop.attach(solver):
        try:
            status = solver.Solve(model)
        finally:
            if stop is not None:
                stop.detach()
    else:
        status = cp_model.UNKNOWN
    status_name = solver.StatusName(status)
    wall = time.perf_counter() - started

    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        node_of = [next(p for p in range(m) if solver.Value(on[i][p])) for i in range(n)]
        topo_pos = {i: k for k, i in enumerate(ix.topo)}
        order = sorted(
            range(n), key=lambda i: (solver.Value(start[i]), solver.Value(end[i]), topo_pos[i])
        )
        found = _schedule(problem, SOLVER_STRATEGY, node_of, order, avail0)
        objective = float(solver.ObjectiveValue())
        int_bound = float(solver.BestObjectiveBound())
    else:
        found = None
        objective = float(hint_makespan)
        int_bound = float(_ceil(bound))
    if found is None or found.makespan_s > hint.makespan_s + 1e-6:
        keep_hint, found = True, Schedule(SOLVER_STRATEGY, hint.assignments, hint.makespan_s, bound)
    else:
        keep_hint = False
    proven = max(bound, int_bound - slack)
    return SolveResult(
        schedule=found,
        status=status_name,
        objective_s=objective,
        bound_s=int_bound,
        proven_bound_s=found.makespan_s if reaches(proven, found.makespan_s) else proven,
        hint=hint,
        kept_hint=keep_hint,
        wall_s=wall,
        time_limit_s=float(time_limit_s),
    )
