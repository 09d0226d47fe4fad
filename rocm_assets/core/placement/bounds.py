"""How good can a plan be: makespan lower bounds, and a checker for any schedule.

The bounds (scheduling-facts §5) each ignore some constraint, so each holds for every plan;
`best_bound` is the best one known, the solver's proven bound when it is tighter, with its
source; `validate_schedule` checks a plan against the cost model and the farm's rules.
"""

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

from rocm_assets.core.build.builds import Build
from rocm_assets.core.placement.problem import EPS, Assignment, Index, Problem, Schedule

# What proved a bound: one of placement's static bounds, or CP-SAT; the label `plan` prints.
BOUND_SOURCES = {
    "path": "static: critical path",
    "work": "static: work",
    "stage": "static: stage",
    "solver": "proven by CP-SAT",
}


@dataclass(frozen=True)
class LowerBounds:
    """Makespan lower bounds (scheduling-facts §5); each ignores some constraint, so each holds."""

    path_s: float
    work_s: float
    stage_s: float

    @property
    def best(self) -> float:
        return max(self.path_s, self.work_s, self.stage_s)

    @property
    def best_source(self) -> str:
        """Which bound is `best` ("path", "work" or "stage"); the first of them on a tie."""
        named = (("path", self.path_s), ("work", self.work_s), ("stage", self.stage_s))
        return max(named, key=lambda item: item[1])[0]


class Bound(NamedTuple):
    """A makespan lower bound and what proved it (a key of `BOUND_SOURCES`)."""

    value_s: float
    source: str

    @property
    def label(self) -> str:
        return BOUND_SOURCES[self.source]


def reaches(bound_s: float, makespan_s: float) -> bool:
    """`bound_s` is `makespan_s` but for float noise: a plan of that makespan is proven optimal."""
    return bound_s >= makespan_s - EPS * max(1.0, makespan_s)


def best_bound(
    problem: Problem, proven_s: float | None = None, makespan_s: float | None = None
) -> Bound:
    """The best lower bound known for `problem`: its static bounds, or `proven_s` (a solve's
    `proven_bound_s`) when that is tighter; equal figures keep the static bound's name. Given a
    plan's `makespan_s`, a bound that `reaches` it is that makespan exactly: the plan is optimal."""
    static = lower_bounds(problem)
    if proven_s is not None and proven_s > static.best + EPS * max(1.0, static.best):
        bound = Bound(proven_s, "solver")
    else:
        bound = Bound(static.best, static.best_source)
    if makespan_s is not None and reaches(bound.value_s, makespan_s):
        return bound._replace(value_s=makespan_s)
    return bound


def _optimistic_finish(ix: Index) -> list[list[float]]:
    """F(i,p) = o(i,p) + max_k min_q [F(k,q) + (q != p ? pull(k,p) : 0)], with no contention."""
    m = len(ix.names)
    inv = ix.inv_link
    finish: list[list[float]] = [[] for _ in ix.builds]
    lowest: list[float] = [0.0] * len(ix.builds)
    for i in ix.topo:
        start = [0.0] * m
        for q, end, size in ix.fixed[i]:
            for p in range(m):
                v = end if p == q else end + size * inv[p]
                if v > start[p]:
                    start[p] = v
        for k in ix.preds[i]:
            fk, low, size = finish[k], lowest[k], ix.size[k]
            for p in range(m):
                v = min(fk[p], low + size * inv[p])
                if v > start[p]:
                    start[p] = v
        finish[i] = [s + o for s, o in zip(start, ix.occ[i], strict=False)]
        lowest[i] = min(finish[i])
    return finish


def _lp_work_s(ix: Index) -> float | None:
    """min T s.t. every build split over the nodes (x >= 0, sum_p x_ip = 1) and every node's
    share sum_i x_ip o(i,p) <= T; None when scipy is not installed or the LP does not solve."""
    try:
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix
    except ImportError:
        return None
    n, m = len(ix.builds), len(ix.names)
    if not n:
        return None
    nvar = n * m + 1
    rows, cols, vals = [], [], []
    for i in range(n):
        for p in range(m):
            rows.append(p)
            cols.append(i * m + p)
            vals.append(ix.occ[i][p])
    for p in range(m):
        rows.append(p)
        cols.append(n * m)
        vals.append(-1.0)
    a_ub = coo_matrix((vals, (rows, cols)), shape=(m, nvar)).tocsr()
    eq_rows = [i for i in range(n) for _ in range(m)]
    a_eq = coo_matrix(([1.0] * (n * m), (eq_rows, list(range(n * m)))), shape=(n, nvar)).tocsr()
    objective = [0.0] * (n * m) + [1.0]
    result = linprog(
        objective,
        A_ub=a_ub,
        b_ub=[0.0] * m,
        A_eq=a_eq,
        b_eq=[1.0] * n,
        bounds=(0, None),
        method="highs",
    )
    if not result.success:
        return None
    # Shaved by a millionth: the solver's tolerance must not push a bound above a real plan.
    return float(result.fun) * (1 - 1e-6)


def lower_bounds(problem: Problem) -> LowerBounds:
    """LB_path, LB_work and LB_stage of scheduling-facts §5; nodes' busy time is ignored (it only
    lengthens a plan), so the bounds hold for any `busy_until`. Computed once per problem: every
    schedule of it carries them."""
    key = id(problem)
    found = _BOUNDS.get(key)
    if found is None:
        found = _BOUNDS[key] = _lower_bounds(problem)
        weakref.finalize(problem, _BOUNDS.pop, key, None)
    return found


# id(problem) -> its bounds, while the problem lives (a Problem holds dicts: not hashable).
_BOUNDS: dict[int, LowerBounds] = {}


def _lower_bounds(problem: Problem) -> LowerBounds:
    ix = problem.index
    n, m = len(ix.builds), len(ix.names)
    if not n:
        return LowerBounds(0.0, 0.0, 0.0)
    finish = _optimistic_finish(ix)
    earliest = [min(row) for row in finish]
    path_s = max(earliest)
    own = [min(row) for row in ix.occ]
    work_s = max(sum(own) / m, *own, _lp_work_s(ix) or 0.0)
    # Everything below v starts after v's push: min F(v) + (its descendants' work) / m.
    below = [0] * n
    for i in reversed(ix.topo):
        mask = 0
        for j in ix.succs[i]:
            mask |= below[j] | (1 << j)
        below[i] = mask
    stage_s = 0.0
    for v in range(n):
        mask, work = below[v], 0.0
        while mask:
            low = mask & -mask
            work += own[low.bit_length() - 1]
            mask ^= low
        stage_s = max(stage_s, earliest[v] + work / m)
    return LowerBounds(path_s, work_s, stage_s)


def validate_schedule(
    problem: Problem, schedule: Schedule, factors: Mapping[Build, float] | None = None
) -> list[str]:
    """What is wrong with `schedule` for `problem`; empty when nothing is.

    Checks: every build exactly once on a known node, each occupancy equal to the cost model's
    (pulls + build + push) times its factor in `factors` (a simulated run's noise), no two
    builds overlapping on a node, no start before a dependency's push ends or before a placed
    build leaves its node, and makespan = last end. Without `factors`, also lower bound <=
    makespan; the bounds are of the estimates, which real durations do not obey.
    """
    ix = problem.index
    node_pos = {name: p for p, name in enumerate(ix.names)}
    errors: list[str] = []
    seen: dict[Build, Assignment] = {}
    for a in schedule.assignments:
        if a.build not in ix.pos:
            errors.append(f"{a.build} is not a build of the problem")
        elif a.build in seen:
            errors.append(f"{a.build} is scheduled twice")
        elif a.node not in node_pos:
            errors.append(f"{a.build} is on unknown node {a.node!r}")
        else:
            seen[a.build] = a
    errors.extend(f"{b} is not scheduled" for b in ix.builds if b not in seen)
    if errors:
        return errors

    def tol(x: float) -> float:
        return 1e-6 * max(1.0, abs(x))

    node_of = [node_pos[seen[b].node] for b in ix.builds]
    end = [seen[b].end_s for b in ix.builds]
    for i, b in enumerate(ix.builds):
        a = seen[b]
        ready, local = ix.inputs(i, node_of, end)
        expected = ix.occupancy(i, node_of[i], local) * (factors[b] if factors else 1.0)
        if abs((a.end_s - a.start_s) - expected) > tol(expected):
            errors.append(
                f"{b} on {a.node} occupies {a.end_s - a.start_s:.3f}s; the cost model says {expected:.3f}s"
            )
        if a.start_s < ready - tol(ready):
            errors.append(
                f"{b} starts at {a.start_s:.3f}s before its inputs are pushed at {ready:.3f}s"
            )
        busy = ix.placed_busy[node_of[i]]
        if a.start_s < busy - tol(busy):
            errors.append(
                f"{b} starts on {a.node} at {a.start_s:.3f}s while a placed build runs to {busy:.3f}s"
            )
    by_node: dict[str, list[Assignment]] = {}
    for a in schedule.assignments:
        by_node.setdefault(a.node, []).append(a)
    for node, items in sorted(by_node.items()):
        items.sort(key=lambda a: (a.start_s, a.end_s))
        for before, after in pairwise(items):
            if after.start_s < before.end_s - tol(before.end_s):
                errors.append(f"{before.build} and {after.build} overlap on {node}")
    last = max(end, default=0.0)
    if abs(schedule.makespan_s - last) > tol(last):
        errors.append(f"makespan {schedule.makespan_s:.3f}s is not the last end {last:.3f}s")
    if factors:
        return errors
    bound = lower_bounds(problem).best
    if schedule.makespan_s < bound - tol(bound):
        errors.append(f"makespan {schedule.makespan_s:.3f}s is below the lower bound {bound:.3f}s")
    if schedule.lower_bound_s > schedule.makespan_s + tol(schedule.makespan_s):
        errors.append(f"reported lower bound {schedule.lower_bound_s:.3f}s exceeds the makespan")
    return errors
