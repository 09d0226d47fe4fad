"""Placement of bake builds on the fleet: cost model, list schedulers, lower bounds, online choice.

Pure: no Dagster, no I/O. The fleet and probe objects are read through the Protocols below, so
`rocm_assets.core.fleet` (pydantic) and test stand-ins both fit.

Time model (scheduling-facts.md §4, §5). A build i placed on node p occupies p for

    o(i, p) = pulls(i, p) + t(i, p) + push(i, p)

and no dependent starts before the push has ended. One build per node at a time: several builds
on one box would each derive MAX_JOBS from MemAvailable as though alone and oversubscribe it.

    J(p)         = max(1, min(cores_p, floor(mem_available_gb_p / 2)))        # MAX_JOBS, 2 GB a job
    t(i, p)      = t_ref(i) * (J_ref / J(p)) ** ALPHA                          # ALPHA = 0.8
                   or the measured duration keyed by (target, node, J(p)) when there is one
    push(i, p)   = size_gb(i) * 8000 / link_mbps(p)                            # GB -> Mbit
    pulls(i, p)  = sum over inputs k of i not built on p: size_gb(k) * 8000 / link_mbps(p)

mem_available comes from a live probe when there is one, else the manifest's mem_gb; J_ref is the
same rule on the manifest's reference node. The consumer's link stands in for its downlink.
Inputs outside the request (a dependency that is neither a build of the problem nor placed) are
taken as already published, and are pulled from the registry at the consumer's link: they cost
the same on every node of the same link, so they favour fast links for big inputs.

Strategies (`STRATEGIES`, `plan`): "greedy" is the seed's rule (longest eligible build to the free
node that finishes it soonest); "critical-path" is HEFT (upward-rank priority, earliest-finish
node, no insertion); "peft" is PEFT (optimistic cost table lookahead); "default" runs all three
and keeps the shortest plan, so it is never worse than greedy. `choose_placements` is the online
form the run coordinator calls; `lower_bounds` and `validate_schedule` judge any plan.
"""

import bisect
import heapq
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, total_ordering
from itertools import pairwise
from operator import add
from typing import NamedTuple, Protocol

# Scaling exponent of build time in job count: Buildbarn's size-class form, scheduling-facts §3.2.
ALPHA = 0.8
GB_PER_JOB = 2.0
MBIT_PER_GB = 8000.0
# Times are seconds in doubles; anything closer than this is the same instant.
_EPS = 1e-6


class PlacementError(ValueError):
    """A placement problem that cannot be planned; the message names the build or node to fix."""


class NodeLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def cores(self) -> int: ...
    @property
    def mem_gb(self) -> float: ...
    @property
    def link_mbps(self) -> float: ...


class TargetCostLike(Protocol):
    @property
    def seconds(self) -> float: ...
    @property
    def size_gb(self) -> float: ...


class ReferenceLike(Protocol):
    @property
    def cores(self) -> int: ...
    @property
    def mem_gb(self) -> float: ...


class FleetLike(Protocol):
    @property
    def nodes(self) -> Sequence[NodeLike]: ...
    @property
    def reference(self) -> ReferenceLike: ...
    def cost(self, target: str) -> TargetCostLike: ...


class ProbeLike(Protocol):
    @property
    def node(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def mem_available_gb(self) -> float | None: ...
    @property
    def cores(self) -> int | None: ...


def _jobs(cores: int, mem_gb: float) -> int:
    return max(1, min(int(cores), math.floor(mem_gb / GB_PER_JOB)))


def max_jobs(node: NodeLike, probe: ProbeLike | None = None) -> int:
    """MAX_JOBS for one build on `node`: 2 GB a job, capped by cores, at least 1.

    A successful probe's MemAvailable and core count replace the manifest's figures; a failed
    probe is ignored here (the caller excludes that node).
    """
    mem, cores = node.mem_gb, node.cores
    if probe is not None:
        if probe.node != node.name:
            raise PlacementError(f"probe of node {probe.node!r} given for node {node.name!r}")
        if probe.ok:
            mem = probe.mem_available_gb if probe.mem_available_gb is not None else mem
            cores = probe.cores if probe.cores is not None else cores
    return _jobs(cores, mem)


def transfer_s(size_gb: float, link_mbps: float) -> float:
    """Seconds to move `size_gb` over a `link_mbps` link."""
    return size_gb * MBIT_PER_GB / link_mbps


class CostModel:
    """Build, push and pull seconds for a target on a node (formulas in the module docstring).

    `measured` maps (target, node name, MAX_JOBS) to the build step's own seconds, without the
    pulls and the push this model adds around it; the Dagster layer fills it from
    materialization metadata.
    """

    def __init__(
        self,
        fleet: FleetLike,
        *,
        probes: Iterable[ProbeLike] = (),
        measured: Mapping[tuple[str, str, int], float] | None = None,
    ) -> None:
        self._fleet = fleet
        self._probes = {probe.node: probe for probe in probes}
        self._measured = dict(measured or {})
        self._measured_targets = {target for target, _, _ in self._measured}
        self._j_ref = _jobs(fleet.reference.cores, fleet.reference.mem_gb)
        self._targets: dict[str, tuple[float, float]] = {}

    @property
    def fleet(self) -> FleetLike:
        return self._fleet

    def max_jobs(self, node: NodeLike) -> int:
        return max_jobs(node, self._probes.get(node.name))

    def _target(self, target: str) -> tuple[float, float]:
        known = self._targets.get(target)
        if known is None:
            cost = self._fleet.cost(target)
            known = self._targets[target] = (float(cost.seconds), float(cost.size_gb))
        return known

    def reference_s(self, target: str) -> float:
        """Build seconds on the reference node: the seed's "longest" ranks by this."""
        return self._target(target)[0]

    def size_gb(self, target: str) -> float:
        return self._target(target)[1]

    def slowdown(self, node: NodeLike) -> float:
        """(J_ref / J(node)) ** ALPHA: the estimate's factor on the reference seconds."""
        return (self._j_ref / self.max_jobs(node)) ** ALPHA

    def has_measured(self, target: str) -> bool:
        return target in self._measured_targets

    def build_s(self, target: str, node: NodeLike) -> float:
        if self.has_measured(target):
            measured = self._measured.get((target, node.name, self.max_jobs(node)))
            if measured is not None:
                return measured
        return self.reference_s(target) * self.slowdown(node)

    def push_s(self, target: str, node: NodeLike) -> float:
        return transfer_s(self.size_gb(target), node.link_mbps)


@total_ordering
@dataclass(frozen=True)
class Build:
    """One bake target for one GPU arch; `arch` is None for a noarch target."""

    target: str
    arch: str | None = None

    def __str__(self) -> str:
        return f"{self.target}@{self.arch}" if self.arch else self.target

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Build):
            return NotImplemented
        return (self.target, self.arch or "") < (other.target, other.arch or "")


class Placed(NamedTuple):
    """A build already running or pushed: its node and when its push ends, in seconds from now."""

    node: str
    end_s: float


@dataclass(frozen=True)
class Assignment:
    build: Build
    node: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Schedule:
    """A plan. Times are seconds from now; a node's occupancy is pulls + build + push."""

    strategy: str
    assignments: tuple[Assignment, ...]
    makespan_s: float
    lower_bound_s: float


@dataclass(frozen=True)
class LowerBounds:
    """Makespan lower bounds (scheduling-facts §5); each ignores some constraint, so each holds."""

    path_s: float
    work_s: float
    stage_s: float

    @property
    def best(self) -> float:
        return max(self.path_s, self.work_s, self.stage_s)


class _Index:
    """A problem as integer-indexed arrays, so the schedulers' inner loops stay cheap."""

    def __init__(self, problem: "Problem") -> None:
        builds = sorted(problem.builds, key=_build_key)
        if len(set(builds)) != len(builds):
            dup = next(b for b, nxt in pairwise(builds) if b == nxt)
            raise PlacementError(f"build {dup} is requested twice")
        nodes = sorted(problem.nodes, key=lambda node: node.name)
        if not nodes:
            raise PlacementError(
                "no usable build node: the fleet is empty or every node is excluded"
            )
        names = [node.name for node in nodes]
        if len(set(names)) != len(names):
            raise PlacementError(f"node names repeat: {', '.join(names)}")
        self.builds = builds
        self.pos = pos = {b: i for i, b in enumerate(builds)}
        both = sorted(pos.keys() & problem.placed.keys(), key=_build_key)
        if both:
            raise PlacementError(f"build {both[0]} is both requested and already placed")
        self.nodes = nodes
        self.names = names
        node_pos = {name: p for p, name in enumerate(names)}
        cost = problem.cost
        n, m = len(builds), len(nodes)
        self.inv_link = inv = [MBIT_PER_GB / node.link_mbps for node in nodes]
        self.size = size = [cost.size_gb(b.target) for b in builds]
        self.ref_s = [cost.reference_s(b.target) for b in builds]
        # Build + push per node, once per target: arches of a target cost the same.
        slowdown = [cost.slowdown(node) for node in nodes]
        rows: dict[str, list[float]] = {}
        for b, ref, gb in zip(builds, self.ref_s, size, strict=False):
            if b.target in rows:
                continue
            if cost.has_measured(b.target):
                rows[b.target] = [
                    cost.build_s(b.target, node) + gb * v
                    for node, v in zip(nodes, inv, strict=False)
                ]
            else:
                rows[b.target] = [ref * f + gb * v for f, v in zip(slowdown, inv, strict=False)]
        self.preds: list[list[int]] = [[] for _ in range(n)]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        # Inputs placed already: (node index or -1 for a node outside the problem, end, size).
        self.fixed: list[list[tuple[int, float, float]]] = [[] for _ in range(n)]
        # occ: build + push + registry pulls. full: occ plus pulling every placed or requested
        # input; a scheduler subtracts the inputs already on the node.
        self.occ: list[list[float]] = []
        self.full: list[list[float]] = []
        empty: frozenset[Build] = frozenset()
        for i, b in enumerate(builds):
            external: list[float] = []
            preds, fixed = self.preds[i], self.fixed[i]
            for dep in problem.deps.get(b, empty):
                k = pos.get(dep)
                if k is not None:
                    if k == i:
                        raise PlacementError(f"build {b} depends on itself")
                    preds.append(k)
                elif dep in problem.placed:
                    placed = problem.placed[dep]
                    where = node_pos.get(placed.node, -1)
                    fixed.append((where, max(0.0, placed.end_s), cost.size_gb(dep.target)))
                else:
                    external.append(cost.size_gb(dep.target))
            # Sorted so float sums do not depend on set iteration order (hash seeds).
            preds.sort()
            fixed.sort()
            for k in preds:
                self.succs[k].append(i)
            row = rows[b.target]
            if external:
                ext = sum(sorted(external))
                row = [o + ext * v for o, v in zip(row, inv, strict=False)]
            self.occ.append(row)
            pulled = sum(size[k] for k in preds) + sum(gb for _, _, gb in fixed)
            self.full.append(
                [o + pulled * v for o, v in zip(row, inv, strict=False)] if pulled else row
            )
        self.fixed_ready = [max((e for _, e, _ in self.fixed[i]), default=0.0) for i in range(n)]
        self.fixed_local: list[dict[int, float]] = []
        for i in range(n):
            local: dict[int, float] = {}
            for q, _, gb in self.fixed[i]:
                if q >= 0:
                    local[q] = local.get(q, 0.0) + gb
            self.fixed_local.append(local)
        self.topo = self._topological(n)
        # A node is busy until its placed builds end, whatever the caller says on top.
        self.placed_busy = [0.0] * m
        for placed in problem.placed.values():
            q = node_pos.get(placed.node)
            if q is not None and placed.end_s > self.placed_busy[q]:
                self.placed_busy[q] = placed.end_s

    def _topological(self, n: int) -> list[int]:
        missing = [len(p) for p in self.preds]
        order = [i for i in range(n) if not missing[i]]
        for i in order:
            for j in self.succs[i]:
                missing[j] -= 1
                if not missing[j]:
                    order.append(j)
        if len(order) != n:
            stuck = sorted(str(self.builds[i]) for i in range(n) if missing[i])
            raise PlacementError(f"dependency cycle among builds: {', '.join(stuck)}")
        return order

    def avail(self, busy_until: Mapping[str, float]) -> list[float]:
        return [
            max(0.0, self.placed_busy[p], busy_until.get(name, 0.0))
            for p, name in enumerate(self.names)
        ]

    def inputs(
        self, i: int, node_of: list[int], end: list[float]
    ) -> tuple[float, dict[int, float]]:
        """When i's inputs are all pushed, and GB of them already on each node."""
        ready = self.fixed_ready[i]
        local = self.fixed_local[i]
        if self.preds[i]:
            local = dict(local)
            size = self.size
            for k in self.preds[i]:
                if end[k] > ready:
                    ready = end[k]
                q = node_of[k]
                local[q] = local.get(q, 0.0) + size[k]
        return ready, local

    def occupancy(self, i: int, p: int, local: Mapping[int, float]) -> float:
        """Pulls of the inputs not already on p, then build and push."""
        return self.full[i][p] - local.get(p, 0.0) * self.inv_link[p]


def _build_key(build: Build) -> tuple[str, str]:
    return (build.target, build.arch or "")


@dataclass(frozen=True, eq=False)
class Problem:
    """Builds to place, their dependencies, the usable nodes and the cost model.

    `deps` may name builds outside `builds`: those found in `placed` (running or pushed) gate
    their dependents until `placed[...].end_s` and cost no pull on their own node; any other is
    taken as already published and pulled from the registry at the consumer's link.
    """

    builds: tuple[Build, ...]
    deps: Mapping[Build, frozenset[Build]]
    nodes: tuple[NodeLike, ...]
    cost: CostModel
    placed: Mapping[Build, Placed] = field(default_factory=dict)

    @cached_property
    def index(self) -> _Index:
        return _Index(self)

    @cached_property
    def bounds(self) -> LowerBounds:
        return lower_bounds(self)


class _Run(NamedTuple):
    node_of: list[int]
    start: list[float]
    end: list[float]

    @property
    def makespan(self) -> float:
        return max(self.end, default=0.0)


def _release(ix: _Index, j: int, end: list[float]) -> float:
    return max([ix.fixed_ready[j], *(end[k] for k in ix.preds[j])])


def _run_greedy(ix: _Index, avail0: list[float], *, first_step_only: bool = False) -> _Run:
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
        while release and release[0][0] <= t + _EPS:
            i = heapq.heappop(release)[1]
            heapq.heappush(eligible, (-ix.ref_s[i], i))
        while busy and busy[0][0] <= t + _EPS:
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
    return _Run(node_of, start, end)


def _run_list(
    ix: _Index, avail0: list[float], priority: list[float], lookahead: list[list[float]] | None
) -> _Run:
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
    return _Run(node_of, start, end)


def _rank_u(ix: _Index) -> list[float]:
    """HEFT upward rank: mean occupancy (build + push) + max over successors of
    (mean pull of this output + their rank): the longest remaining path, transfers included."""
    m = len(ix.names)
    mean_inv = sum(ix.inv_link) / m
    rank = [0.0] * len(ix.builds)
    for i in reversed(ix.topo):
        tail = max((rank[j] for j in ix.succs[i]), default=None)
        rank[i] = sum(ix.occ[i]) / m + (0.0 if tail is None else ix.size[i] * mean_inv + tail)
    return rank


def _oct(ix: _Index) -> list[list[float]]:
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


def _run_critical_path(ix: _Index, avail0: list[float]) -> _Run:
    return _run_list(ix, avail0, _rank_u(ix), None)


def _run_peft(ix: _Index, avail0: list[float]) -> _Run:
    table = _oct(ix)
    m = len(ix.names)
    return _run_list(ix, avail0, [sum(row) / m for row in table], table)


_HEURISTICS: dict[str, Callable[[_Index, list[float]], _Run]] = {
    "critical-path": _run_critical_path,
    "peft": _run_peft,
    "greedy": _run_greedy,
}


def _run_default(ix: _Index, avail0: list[float]) -> tuple[str, _Run]:
    """Every heuristic, the shortest plan kept; ties (to the microsecond) go to the earlier one
    in _HEURISTICS."""
    runs = [(name, run(ix, avail0)) for name, run in _HEURISTICS.items()]
    return min(runs, key=lambda item: round(item[1].makespan, 6))


def _schedule(problem: Problem, strategy: str, run: _Run) -> Schedule:
    ix = problem.index
    assignments = sorted(
        (
            Assignment(ix.builds[i], ix.names[run.node_of[i]], run.start[i], run.end[i])
            for i in range(len(ix.builds))
        ),
        key=lambda a: (a.start_s, a.node, a.build),
    )
    return Schedule(strategy, tuple(assignments), run.makespan, problem.bounds.best)


def greedy(problem: Problem, busy_until: Mapping[str, float]) -> Schedule:
    ix = problem.index
    return _schedule(problem, "greedy", _run_greedy(ix, ix.avail(busy_until)))


def critical_path(problem: Problem, busy_until: Mapping[str, float]) -> Schedule:
    ix = problem.index
    return _schedule(problem, "critical-path", _run_critical_path(ix, ix.avail(busy_until)))


def peft(problem: Problem, busy_until: Mapping[str, float]) -> Schedule:
    ix = problem.index
    return _schedule(problem, "peft", _run_peft(ix, ix.avail(busy_until)))


def default(problem: Problem, busy_until: Mapping[str, float]) -> Schedule:
    """The shortest of the heuristics' plans: never worse than greedy, which is one of them."""
    ix = problem.index
    name, run = _run_default(ix, ix.avail(busy_until))
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


def _optimistic_finish(ix: _Index) -> list[list[float]]:
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


def _lp_work_s(ix: _Index) -> float | None:
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
    lengthens a plan), so the bounds hold for any `busy_until`."""
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


def validate_schedule(problem: Problem, schedule: Schedule) -> list[str]:
    """What is wrong with `schedule` for `problem`; empty when nothing is.

    Checks: every build exactly once on a known node, each occupancy equal to the cost model's
    (pulls + build + push), no two builds overlapping on a node, no start before a dependency's
    push ends or before a placed build leaves its node, and lower bound <= makespan = last end.
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
        expected = ix.occupancy(i, node_of[i], local)
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
    bound = problem.bounds.best
    if schedule.makespan_s < bound - tol(bound):
        errors.append(f"makespan {schedule.makespan_s:.3f}s is below the lower bound {bound:.3f}s")
    if schedule.lower_bound_s > schedule.makespan_s + tol(schedule.makespan_s):
        errors.append(f"reported lower bound {schedule.lower_bound_s:.3f}s exceeds the makespan")
    return errors


class Start(NamedTuple):
    """A build to start now on `node`; times are on the caller's clock (`now_s` + plan offset)."""

    build: Build
    node: str
    est_start_s: float
    est_finish_s: float


@dataclass(frozen=True)
class Waiting:
    """Why a pending build does not start now: unfinished `deps`, or no node for it yet."""

    reason: str
    deps: tuple[Build, ...] = ()
    node: str | None = None
    est_start_s: float | None = None


@dataclass(frozen=True)
class Decision:
    strategy: str
    starts: tuple[Start, ...]
    waiting: Mapping[Build, Waiting]


def choose_placements(
    pending: Collection[Build],
    running: Mapping[Build, tuple[str, float]],
    nodes: Sequence[NodeLike],
    cost: CostModel,
    now_s: float,
    deps: Mapping[Build, frozenset[Build]],
    pushed: Mapping[Build, str] | None = None,
    strategy: str = "default",
) -> Decision:
    """Which pending builds start now, and where: the online decision of the run coordinator.

    `running` maps a build in flight to (node, estimated end on the `now_s` clock); `pushed`
    maps a finished build to the node that built it (so a dependent there pulls nothing). A
    dependency in neither nor in `pending` is taken as published. Only eligible builds start
    (no dependency pending or running), at most one per free node (a node running nothing).

    The remaining DAG is planned with `strategy` from now (for "default", every heuristic, the
    shortest plan kept) and the builds that plan starts at once on free nodes are returned.
    "greedy" runs only the seed's rule for this instant.
    """
    if strategy not in STRATEGIES:
        raise PlacementError(
            f"unknown placement strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
        )
    pending_set = set(pending)
    both = sorted(pending_set & running.keys(), key=_build_key)
    if both:
        raise PlacementError(f"build {both[0]} is both pending and running")
    unfinished = pending_set | running.keys()
    empty: frozenset[Build] = frozenset()
    blocked: dict[Build, tuple[Build, ...]] = {}
    for b in pending_set:
        waits_for = tuple(
            sorted((d for d in deps.get(b, empty) if d in unfinished), key=_build_key)
        )
        if waits_for:
            blocked[b] = waits_for
    waiting: dict[Build, Waiting] = {
        b: Waiting(f"waits for {', '.join(map(str, ds))}", deps=ds) for b, ds in blocked.items()
    }
    busy_nodes = {node for node, _ in running.values()}
    free = {node.name for node in nodes} - busy_nodes
    if not pending_set:
        return Decision(strategy, (), waiting)
    if not nodes:
        for b in pending_set - blocked.keys():
            waiting[b] = Waiting("no usable build node")
        return Decision(strategy, (), waiting)

    # A build still running past its estimate is taken to need one more second, so the plan
    # neither starts its dependents nor reuses its node at once.
    placed = {b: Placed(node, max(end - now_s, 1.0)) for b, (node, end) in running.items()}
    for b, node in (pushed or {}).items():
        placed.setdefault(b, Placed(node, 0.0))
    problem = Problem(tuple(pending_set), deps, tuple(nodes), cost, placed)
    ix = problem.index
    avail0 = ix.avail({})
    if strategy == "greedy":
        # The seed's rule needs only this instant; free nodes are exactly those at time 0.
        label, run = "greedy", _run_greedy(ix, avail0, first_step_only=True)
    elif strategy == "default":
        name, run = _run_default(ix, avail0)
        label = f"default({name})"
    else:
        label, run = strategy, _HEURISTICS[strategy](ix, avail0)

    starts: list[Start] = []
    later: list[int] = []
    for i, b in enumerate(ix.builds):
        if b in blocked:
            continue
        p = run.node_of[i]
        if p >= 0 and run.start[i] <= _EPS and ix.names[p] in free:
            # At most one per node: a plan never starts two builds on a node at one instant.
            starts.append(Start(b, ix.names[p], now_s, now_s + run.end[i] - run.start[i]))
        else:
            later.append(i)
    idle = free - {s.node for s in starts}
    for i in later:
        p = run.node_of[i]
        if p < 0:
            waiting[ix.builds[i]] = Waiting("no free node")
            continue
        node, offset = ix.names[p], run.start[i]
        # With a node idle, waiting is the plan's choice: this node finishes it sooner.
        reason = f"held for {node}, the soonest finish" if idle else "no free node"
        waiting[ix.builds[i]] = Waiting(
            f"{reason} (planned on {node} at +{offset:.0f}s)", node=node, est_start_s=now_s + offset
        )
    starts.sort(key=lambda s: (s.node, _build_key(s.build)))
    return Decision(label, tuple(starts), waiting)
