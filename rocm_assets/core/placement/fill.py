"""Filling an idle node: a move of one ready build onto a node the plan leaves idle now.

With noisy durations a plan's node often frees before its next planned build can start (an
input still building elsewhere) while a ready build waits for a busy node. Re-deciding at every
event would start that build on the free node; re-planning from scratch (tried: the idle-node
re-plan, docs/benchmarks.md) throws away the solver's plan. `best_move` tries each such move on
the plan being followed, re-timed from now, and keeps the best one only if it scores better
than the plan unmoved: by the follower's score (makespan, or mean makespan under the learned
spread), then by the sum of finish times, so with exact estimates a move never lengthens the
plan and one that finishes a build sooner at no cost is taken.
"""

from collections.abc import Callable, Mapping, Sequence

from rocm_assets.core.build.builds import Build
from rocm_assets.core.placement.problem import Index, Run
from rocm_assets.core.placement.robust import retime

# Moves tried per check: the earliest-planned ready builds, each on the idle nodes where it is
# quickest, so a check stays a few re-timings even on a big plan and fleet (300 builds, 50
# nodes: docs/benchmarks.md).
MOVE_BUILDS = 8
MOVE_NODES = 2


def best_move(
    ix: Index,
    avail0: Sequence[float],
    slots: Mapping[Build, tuple[str, float, float]],
    idle: Sequence[str],
    ready: Sequence[Build],
    score: Callable[[Run], float],
) -> Run | None:
    """The plan `slots` re-timed with one of `ready` moved to the front of one `idle` node, when
    that scores better than `slots` re-timed; else None. `ready` in the order to try."""
    current = retime(ix, avail0, slots)
    if current is None:
        return None

    def key(run: Run) -> tuple[float, float]:
        return (score(run), round(sum(run.end), 6))

    best, best_key = None, key(current)
    moved = dict(slots)
    node_pos = {name: p for p, name in enumerate(ix.names)}
    for b in ready[:MOVE_BUILDS]:
        slot, full = slots[b], ix.full[ix.pos[b]]
        nodes = sorted((n for n in idle if n != slot[0]), key=lambda n: full[node_pos[n]])
        for node in nodes[:MOVE_NODES]:
            # First on the node: it is ready, so it starts as soon as the node is free.
            moved[b] = (node, float("-inf"), float("-inf"))
            run = retime(ix, avail0, moved)
            if run is not None and (k := key(run)) < best_key:
                best, best_key = run, k
        moved[b] = slot
    return best
