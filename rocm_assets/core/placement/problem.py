"""A placement problem and its plans: the builds, their deps, the nodes, and an indexed form.

`Problem.index` turns a problem into integer-indexed arrays once, so the schedulers' and the
bounds' inner loops stay cheap; `Schedule` is what every strategy returns.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise
from typing import NamedTuple

from rocm_assets.core.build.builds import Build
from rocm_assets.core.placement.cost import MBIT_PER_GB, CostModel, NodeLike, PlacementError

# Times are seconds in doubles; anything closer than this is the same instant.
EPS = 1e-6


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


class Index:
    """A problem as integer-indexed arrays, so the schedulers' inner loops stay cheap."""

    def __init__(self, problem: "Problem") -> None:
        builds = sorted(problem.builds, key=build_key)
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
        both = sorted(pos.keys() & problem.placed.keys(), key=build_key)
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


def build_key(build: Build) -> tuple[str, str]:
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
    def index(self) -> Index:
        return Index(self)


class Run(NamedTuple):
    node_of: list[int]
    start: list[float]
    end: list[float]

    @property
    def makespan(self) -> float:
        return max(self.end, default=0.0)


def left_shift(
    ix: Index, node_of: Sequence[int], order: Sequence[int], avail0: Sequence[float]
) -> Run:
    """Times for fixed nodes and a per-node order: each build starts as soon as its node is free
    and its inputs are pushed, which is what following the plan does. `order` must list every
    build once, dependencies first."""
    n = len(ix.builds)
    start, end = [0.0] * n, [0.0] * n
    avail = list(avail0)
    nodes = list(node_of)
    for i in order:
        ready, local = ix.inputs(i, nodes, end)
        p = nodes[i]
        start[i] = avail[p] if avail[p] > ready else ready
        end[i] = start[i] + ix.occupancy(i, p, local)
        avail[p] = end[i]
    return Run(nodes, start, end)
