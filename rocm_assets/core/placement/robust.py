"""Judging plans: re-timed from now, and when real durations stray, their mean makespan.

`retime` follows a plan (node and order per build) from a new state, so plans made at different
times compare on the same footing.

A plan packed tight around the estimates can lose more to noise than one with slack where it
matters. Once the plan follower has seen builds stray (`Spread`: the root mean square of
log(real / estimated) over the builds it saw finish), it compares candidate plans by their mean
makespan over `draws` of lognormal duration factors with that spread, the same draws for every
candidate, each draw followed as the follower follows a plan: each node in plan order, each
build once its inputs are pushed. With exact estimates the spread is 0 and plans compare by
their makespan alone.
"""

import math
import random
from collections.abc import Mapping, Sequence

from rocm_assets.core.build.builds import Build
from rocm_assets.core.placement.problem import Index, Run, left_shift

# Observations before the spread is trusted, and the least spread worth sampling.
MIN_OBSERVED = 3
MIN_SIGMA = 0.02


class Spread:
    """How far real build times stray from their estimates, as a lognormal sigma."""

    def __init__(self) -> None:
        self._squares = 0.0
        self.observed = 0

    def add(self, real_s: float, estimate_s: float) -> None:
        if real_s > 0 and estimate_s > 0:
            self._squares += math.log(real_s / estimate_s) ** 2
            self.observed += 1

    @property
    def sigma(self) -> float:
        """0 until MIN_OBSERVED builds were seen, or when they kept to their estimates."""
        if self.observed < MIN_OBSERVED:
            return 0.0
        sigma = math.sqrt(self._squares / self.observed)
        return sigma if sigma >= MIN_SIGMA else 0.0


def draws(builds: int, sigma: float, samples: int, seed: int) -> list[list[float]]:
    """`samples` rows of one lognormal(0, sigma) factor per build."""
    rng = random.Random(seed)
    return [[rng.lognormvariate(0.0, sigma) for _ in range(builds)] for _ in range(samples)]


def order_of(ix: Index, run: Run) -> list[int]:
    """The plan's global order: by start, then end, then dependency order."""
    topo = [0] * len(ix.builds)
    for k, i in enumerate(ix.topo):
        topo[i] = k
    return sorted(range(len(ix.builds)), key=lambda i: (run.start[i], run.end[i], topo[i]))


def mean_makespan(
    ix: Index,
    avail0: Sequence[float],
    node_of: Sequence[int],
    order: Sequence[int],
    factors: Sequence[Sequence[float]],
) -> float:
    """The plan (nodes, and per node the order of `order`) followed under each row of duration
    factors: the mean makespan."""
    total = 0.0
    n = len(ix.builds)
    for row in factors:
        end = [0.0] * n
        avail = list(avail0)
        last = 0.0
        for i in order:
            ready, local = ix.inputs(i, node_of, end)
            p = node_of[i]
            start = avail[p] if avail[p] > ready else ready
            end[i] = start + ix.occupancy(i, p, local) * row[i]
            avail[p] = end[i]
            if end[i] > last:
                last = end[i]
        total += last
    return total / len(factors)


def retime(
    ix: Index, avail0: Sequence[float], slots: Mapping[Build, tuple[str, float, float]]
) -> Run | None:
    """The plan `slots` (node, start, end per build) for the builds of `ix`, re-timed from
    `avail0` by following it: each node in the plan's order, each build once its inputs are
    pushed. None when it misses a build or names a node `ix` lacks."""
    if not slots:
        return None
    node_pos = {name: p for p, name in enumerate(ix.names)}
    n = len(ix.builds)
    topo = [0] * n
    for k, i in enumerate(ix.topo):
        topo[i] = k
    node_of = [0] * n
    keys: list[tuple[float, int, int]] = []
    for i, b in enumerate(ix.builds):
        slot = slots.get(b)
        p = None if slot is None else node_pos.get(slot[0])
        if slot is None or p is None:
            return None
        node_of[i] = p
        keys.append((slot[1], topo[i], i))
    # A valid plan starts every input before its dependents; ties go in dependency order.
    order = [i for *_, i in sorted(keys)]
    return left_shift(ix, node_of, order, avail0)
