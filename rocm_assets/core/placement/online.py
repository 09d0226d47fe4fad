"""The online decision: which pending builds start now, and where.

The run coordinator and the benchmark's simulator ask `choose_placements` at each event with
the state of that moment; it plans the remaining DAG and starts what the plan starts at once.
"""

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from rocm_assets.core.build.builds import Build
from rocm_assets.core.placement.cost import CostModel, NodeLike, PlacementError
from rocm_assets.core.placement.heuristics import HEURISTICS, STRATEGIES, run_default, run_greedy
from rocm_assets.core.placement.problem import EPS, Placed, Problem, build_key


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
    held: Mapping[str, float] | None = None,
) -> Decision:
    """Which pending builds start now, and where: the online decision of the run coordinator.

    `running` maps a build in flight to (node, estimated end on the `now_s` clock); `pushed`
    maps a finished build to the node that built it (so a dependent there pulls nothing);
    `held` maps a node taken by something else to when it is estimated to be free. A
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
    both = sorted(pending_set & running.keys(), key=build_key)
    if both:
        raise PlacementError(f"build {both[0]} is both pending and running")
    unfinished = pending_set | running.keys()
    empty: frozenset[Build] = frozenset()
    blocked: dict[Build, tuple[Build, ...]] = {}
    for b in pending_set:
        waits_for = tuple(sorted((d for d in deps.get(b, empty) if d in unfinished), key=build_key))
        if waits_for:
            blocked[b] = waits_for
    waiting: dict[Build, Waiting] = {
        b: Waiting(f"waits for {', '.join(map(str, ds))}", deps=ds) for b, ds in blocked.items()
    }
    busy_nodes = {node for node, _ in running.values()} | set(held or {})
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
    # A held node, like a running build past its estimate, is taken as free a second from now.
    avail0 = ix.avail({node: max(until - now_s, 1.0) for node, until in (held or {}).items()})
    if strategy == "greedy":
        # The seed's rule needs only this instant; free nodes are exactly those at time 0.
        label, run = "greedy", run_greedy(ix, avail0, first_step_only=True)
    elif strategy == "default":
        name, run = run_default(ix, avail0)
        label = f"default({name})"
    else:
        label, run = strategy, HEURISTICS[strategy](ix, avail0)

    starts: list[Start] = []
    later: list[int] = []
    for i, b in enumerate(ix.builds):
        if b in blocked:
            continue
        p = run.node_of[i]
        if p >= 0 and run.start[i] <= EPS and ix.names[p] in free:
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
    starts.sort(key=lambda s: (s.node, build_key(s.build)))
    return Decision(label, tuple(starts), waiting)
