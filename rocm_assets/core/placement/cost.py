"""The cost model: how long a build occupies a node (see the package docstring).

Pure: no Dagster, no I/O. The fleet and probe objects are read through the Protocols below, so
`rocm_assets.core.nodes.fleet` (pydantic) and test stand-ins both fit.
"""

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

ALPHA = 0.8
GB_PER_JOB = 2.0
MBIT_PER_GB = 8000.0
# Times are seconds in doubles; anything closer than this is the same instant.
EPS = 1e-6


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
    materialization metadata, leaving out runs that pushed nothing new (cache hits). A sample
    for exactly (target, node, its MAX_JOBS now) is that build's duration. Otherwise every
    sample of the target predicts it by the job-count law the estimate uses: each is brought to
    the reference node, t_ref = t * (J_sample / J_ref) ** ALPHA, and the median of those stands
    in for the table's seconds, so one build on any node improves the estimate on every node.
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
        self._j_ref = _jobs(fleet.reference.cores, fleet.reference.mem_gb)
        at_ref: dict[str, list[float]] = {}
        for (target, _, jobs), seconds in sorted(self._measured.items()):
            at_ref.setdefault(target, []).append(seconds * (max(1, jobs) / self._j_ref) ** ALPHA)
        # Median over the samples: one odd run (a cold cache, a busy box) moves it little.
        self._measured_ref = {t: statistics.median(v) for t, v in at_ref.items()}
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
        return target in self._measured_ref

    def build_s(self, target: str, node: NodeLike) -> float:
        """Build seconds of `target` on `node`: its exact measurement, else the measured median
        brought to this node's job count, else the table's estimate."""
        at_ref = self._measured_ref.get(target)
        if at_ref is None:
            return self.reference_s(target) * self.slowdown(node)
        jobs = self.max_jobs(node)
        exact = self._measured.get((target, node.name, jobs))
        if exact is not None:
            return exact
        return at_ref * (self._j_ref / jobs) ** ALPHA

    def push_s(self, target: str, node: NodeLike) -> float:
        return transfer_s(self.size_gb(target), node.link_mbps)
