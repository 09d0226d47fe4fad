"""The list schedulers: the seed's greedy rule, HEFT (critical-path), PEFT, and `default`.

Each plans a whole `Problem` from now; `plan` picks one by name. `default` runs all three and
keeps the shortest plan, so it is never worse than greedy.
"""

import bisect
import heapq
from collections.abc import Callable, Mapping
from operator import add

from rocm_assets.core.placement.bounds import lower_bounds
from rocm_assets.core.placement.cost import PlacementError
from rocm_assets.core.placement.problem import EPS, Assignment, Index, Problem, Run, Schedule


def _release(ix: Index, j: int, end: list[float]) -> float:
    return max([ix.fixed_ready[j], *(end[k] for k in ix.preds[j])])


def run_greedy(ix: Index, avail0: list[float], *, first_step_only: bool = False) -> Run:
    """The seed's rule, event by event: at each moment nodes are free, the longest eligible build
    (reference seconds) goes to the free node that would finish it soonest, until no free node or
    no eligible build is left; then time moves to the next node freeing or build becoming ready.
    Ties go to the lower build, then node, by name."""
    n, m = len(ix.builds), len(ix.names)
    node_of, start, end = [-1] * n, [0.0] * n, [0.0] * n
    missing = [len(p) for p in ix.preds]
    release = [(ix.fixed_ready[i], i) for i in range(n) if not missing[i]]
    heapq.heapify(release)
    busy = [(avail0[p], p) for p in range(m) if avail0[p] > 0.0]
    heapq.heapify(busy)
    free = [p for p in range(m) if avail0[p] <= 0.0]
    eligible: list[tuple[float, int]] = []
    full, inv = ix.full, ix.inv_link
    t, done = 0.0, 0
    while done < n:
        while release and release[0][0] <= t + EPS:
            i = heapq.heappop(release)[1]
            heapq.heappush(eligible, (-ix.ref_s[i], i))
        while busy and busy[0][0] <= t + EPS:
            bisect.insort(free, heapq.heappop(busy)[1])
        while free and eligible:
            i = heapq.heappop(eligible)[1]
            _, local = ix.inputs(i, node_of, end)
            row = full[i]
            if local:
                occupied = [row[p] - local[p] * inv[p] if p in local else row[p] for p in free]
            else:
                occupied = [row[p] for p in free]
            shortest = min(occupied)
            best_p = free.pop(occupied.index(shortest))
            best_fin = t + shortest
            node_of[i], start[i], end[i] = best_p, t, best_fin
            heapq.heappush(busy, (best_fin, best_p))
            done += 1
            for j in ix.succs[i]:
                missing[j] -= 1
                if not missing[j]:
                    heapq.heappush(release, (_release(ix, j, end), j))
        if first_step_only:
            break
        later = [heap[0][0] for heap in (busy, release) if heap]
        if not later:
            break
        t = max(t, min(later))
    return Run(node_of, start, end)


def _run_list(
    ix: Index, avail0: list[float], priority: list[float], lookahead: list[list[float]] | None
) -> Run:
    """List scheduling: the highest-priority ready build goes to the node with the least
    EFT (+ lookahead), no insertion into gaps. Ties go to the first node by name."""
    n = len(ix.builds)
    avail = list(avail0)
    node_of, start, end = [-1] * n, [0.0] * n, [0.0] * n
    missing = [len(p) for p in ix.preds]
    ready_heap = [(-priority[i], i) for i in range(n) if not missing[i]]
    heapq.heapify(ready_heap)
    inv = ix.inv_link
    while ready_heap:
        i = heapq.heappop(ready_heap)[1]
        ready, local = ix.inputs(i, node_of, end)
        fin = [(a if a > ready else ready) + c for a, c in zip(avail, ix.full[i], strict=False)]
        for q, gb in local.items():
            fin[q] -= gb * inv[q]
        if lookahead is None:
            p = fin.index(min(fin))
        else:
            key = [f + x for f, x in zip(fin, lookahead[i], strict=False)]
            p = key.index(min(key))
        node_of[i], end[i] = p, fin[p]
        start[i] = avail[p] if avail[p] > ready else ready
        avail[p] = fin[p]
        for j in ix.succs[i]:
            missing[j] -= 1
            if not missing[j]:
                heapq.heappush(ready_heap, (-priority[j], j))
    return Run(node_of, start, end)


def _rank_u(ix: Index) -> list[float]:
    """HEFT upward rank: mean occupancy (build + push) + max over successors of
    (mean pull of this output + their rank): the longest remaining path, transfers included."""
    m = len(ix.names)
    mean_inv = sum(ix.inv_link) / m
    rank = [0.0] * len(ix.builds)
    for i in reversed(ix.topo):
        tail = max((rank[j] for j in ix.succs[i]), default=None)
        rank[i] = sum(ix.occ[i]) / m + (0.0 if tail is None else ix.size[i] * mean_inv + tail)
    return rank


def _oct(ix: Index) -> list[list[float]]:
    """PEFT's optimistic cost table: OCT(i,p) = max_j min_q [OCT(j,q) + o(j,q) + (q != p ? c : 0)],
    with c the exact pull of i's output on q rather than the mean (our links are known)."""
    m = len(ix.names)
    inv = ix.inv_link
    table: list[list[float]] = [[0.0] * m for _ in ix.builds]
    # OCT(j,q) + o(j,q), filled in as the table is.
    here: list[list[float]] = [[] for _ in ix.builds]
    for i in reversed(ix.topo):
        succs = ix.succs[i]
        if succs:
            size = ix.size[i]
            pull = [size * v for v in inv]
            # min over q != p of (h[q] + pull[q]) may as well range over every q: for q = p,
            # h[p] + pull[p] >= h[p], the term the outer min already holds.
            h = here[succs[0]]
            away = min(map(add, h, pull))
            row = [x if x < away else away for x in h]
            for j in succs[1:]:
                h = here[j]
                away = min(map(add, h, pull))
                row = [
                    r if r >= x or r >= away else (x if x < away else away)
                    for r, x in zip(row, h, strict=False)
                ]
            table[i] = row
        here[i] = list(map(add, table[i], ix.occ[i]))
    return table


def _run_critical_path(ix: Index, avail0: list[float]) -> Run:
    return _run_list(ix, avail0, _rank_u(ix), None)


def _run_peft(ix: Index, avail0: list[float]) -> Run:
    table = _oct(ix)
    m = len(ix.names)
    return _run_list(ix, avail0, [sum(row) / m for row in table], table)


HEURISTICS: dict[str, Callable[[Index, list[float]], Run]] = {
    "critical-path": _run_critical_path,
    "peft": _run_peft,
    "greedy": run_greedy,
}


def run_default(ix: Index, avail0: list[float]) -> tuple[str, Run]:
    """Every heuristic, the shortest plan kept; ties (to the microsecond) go to the earlier one
    in HEURISTICS."""
    runs = [(name, run(ix, avail0)) for name, run in HEURISTICS.items()]
    return min(runs, key=lambda item: round(item[1].makespan, 6))


def _schedule(problem: Problem, strategy: str, run: Run) -> Schedule:
    ix = problem.index
    assignments = sorted(
        (
            Assignment(ix.builds[i], ix.names[run.node_of[i]], run.start[i], run.end[i])
            for i in range(len(ix.builds))
        ),
        key=lambda a: (a.start_s, a.node, a.build),
    )
    return Schedule(strategy, tuple(assignments), run.makespan, lower_bounds(problem).best)


def greedy(problem: Problem, busy_until: Mapping[str, float]) -> Schedule:
    ix = problem.index
    return _schedule(problem, "greedy", run_greedy(ix, ix.avail(busy_until)))


def critical_path(problem: Problem, busy_until: Mapping[str, float]) -> Schedule:
    ix = problem.index
    return _schedule(problem, "critical-path", _run_critical_path(ix, ix.avail(busy_until)))


def peft(problem: Problem, busy_until: Mapping[str, float]) -> Schedule:
    ix = problem.index
    return _schedule(problem, "peft", _run_peft(ix, ix.avail(busy_until)))


def default(problem: Problem, busy_until: Mapping[str, float]) -> Schedule:
    """The shortest of the heuristics' plans: never worse than greedy, which is one of them."""
    ix = problem.index
    name, run = run_default(ix, ix.avail(busy_until))
    return _schedule(problem, f"default({name})", run)


STRATEGIES: dict[str, Callable[[Problem, Mapping[str, float]], Schedule]] = {
    "default": default,
    "greedy": greedy,
    "critical-path": critical_path,
    "peft": peft,
}


def plan(
    problem: Problem, strategy: str = "default", busy_until: Mapping[str, float] | None = None
) -> Schedule:
    """Plan every build of `problem`; `busy_until` gives seconds from now until a node is free."""
    run = STRATEGIES.get(strategy)
    if run is None:
        raise PlacementError(
            f"unknown placement strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
        )
    return run(problem, busy_until or {})
