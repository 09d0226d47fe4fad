"""What one placement tick reads of the farm, and the changes it found due. Nothing here writes:
the tick (`rocm_assets.instance.placer`) applies the changes through the authority."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import dagster as dg

from rocm_assets.core import placement
from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.build.builds import Build
from rocm_assets.core.build.guard import GRACE_S
from rocm_assets.core.common.constants import (
    PLACEMENT_PLACED,
    PLACEMENT_WAITING,
    ROCM_BUILD_TAG,
    ROCM_EST_FINISH_TAG,
    ROCM_PLACEMENT_TAG,
)
from rocm_assets.core.common.timefmt import from_iso
from rocm_assets.core.nodes.fleet import Fleet
from rocm_assets.core.placement.farm import Hold, Running
from rocm_assets.instance import claims
from rocm_assets.instance.runs import IN_FLIGHT_STATUSES, builds_of_run

# How long a cancelled bake is expected to take to end: the bake guard's grace, and some.
_ENDING_BAKE_S = GRACE_S + 10.0
# A tick tags a run placed right after claiming its builder; a claim left untagged this long
# was made by a tick that died.
_UNTAGGED_CLAIM_GRACE_S = 30.0


@dataclass
class Waiting:
    run: dg.DagsterRun
    build: Build
    in_process: bool


@dataclass
class TickReading:
    """Waiting builds, what holds each machine, finished inputs; and what the tick must change."""

    waiting: dict[Build, Waiting] = field(default_factory=dict)
    running: dict[Build, Running] = field(default_factory=dict)
    holds: list[Hold] = field(default_factory=list)
    # build -> run id: its bake is over (the builder is freed) but its run has not recorded a
    # materialization: not yet known published or failed.
    ending: dict[Build, str] = field(default_factory=dict)
    in_progress: int = 0
    # Claims made by a tick that died before tagging, and claims of workers that stopped
    # renewing their lease: (run, builder).
    undo: list[tuple[dg.DagsterRun, str]] = field(default_factory=list)
    expire: list[tuple[dg.DagsterRun, str]] = field(default_factory=list)
    # Runs whose own data cannot be placed, and why.
    broken: list[tuple[dg.DagsterRun, Exception]] = field(default_factory=list)
    # Runs that wait for a reason found while reading (the same build elsewhere).
    told: list[tuple[dg.DagsterRun, str]] = field(default_factory=list)


@dataclass
class FarmReader:
    """Reads the runs in flight and the claims into a `TickReading`."""

    instance: dg.DagsterInstance
    graph: BakeGraph
    fleet: Fleet
    lease_seconds: float
    now: float

    def read(
        self, draining: Mapping[str, tuple[str, float]], in_process_only: bool = False
    ) -> TickReading:
        """`draining`: builder -> (run id, when it ended) of ended runs still holding one.
        `in_process_only`: queued runs are not waiting (nobody would launch them)."""
        reading = TickReading()
        holder_of = {run_id: b for b, run_id in claims.claims(self.instance).items()}
        records = self.instance.get_run_records(dg.RunsFilter(statuses=list(IN_FLIGHT_STATUSES)))
        # Started runs renew their lease; a queued one has one from the tick that claimed for it.
        leased = [
            r.dagster_run.run_id
            for r in records
            if r.dagster_run.status == dg.DagsterRunStatus.STARTED
            or r.dagster_run.run_id in holder_of
        ]
        lease = claims.leases(self.instance, leased)
        seen: dict[Build, str] = {}
        for record in records:
            self._sort(record, holder_of.get(record.dagster_run.run_id), lease, seen, reading)
        if in_process_only:
            reading.waiting = {b: w for b, w in reading.waiting.items() if w.in_process}
        by_builder = {n.builder: n.name for n in self.fleet.nodes}
        for builder, (run_id, ended) in draining.items():
            node = by_builder.get(builder, f"builder:{builder}")
            reading.holds.append(
                Hold(
                    node,
                    ended,
                    max(ended + _ENDING_BAKE_S, self.now + 1.0),
                    f"{node} is held by the ending bake of run {run_id[:8]}",
                )
            )
        # A build both running and waiting: the waiting request runs after it.
        for build in [b for b in reading.waiting if b in reading.running]:
            run = reading.waiting.pop(build).run
            reading.told.append((run, f"{build} is building on {reading.running[build].node}"))
        return reading

    def _sort(
        self,
        record: dg.RunRecord,
        builder: str | None,
        lease: Mapping[str, float],
        seen: dict[Build, str],
        reading: TickReading,
    ) -> None:
        """Put one run in flight where it belongs: holding a machine, ending, or waiting."""
        run = record.dagster_run
        if run.status != dg.DagsterRunStatus.QUEUED:
            reading.in_progress += 1
        if builder is not None and self._claimed_by_a_dead_tick(run, lease.get(run.run_id)):
            reading.undo.append((run, builder))
            builder = None
        alive = self._alive(record, lease.get(run.run_id))
        if builder is not None and not alive:
            reading.expire.append((run, builder))
            return
        try:
            build = self._build_of(run)
        except Exception as exc:
            reading.broken.append((run, exc))
            build = None
        if builder is not None:
            self._holding(record, builder, build, reading)
            if build is not None:
                seen[build] = run.run_id
            return
        placed = run.tags.get(ROCM_PLACEMENT_TAG) == PLACEMENT_PLACED
        if build is not None and run.status != dg.DagsterRunStatus.QUEUED and placed:
            # The build resource frees the builder when the bake ends, before the run records
            # how: a failed input must not pass for a published one meanwhile.
            if not self._materialized(run.run_id):
                reading.ending[build] = run.run_id
            return
        if build is None or run.tags.get(ROCM_PLACEMENT_TAG) != PLACEMENT_WAITING:
            return
        in_process = run.status == dg.DagsterRunStatus.STARTED
        if run.status != dg.DagsterRunStatus.QUEUED and not (in_process and alive):
            return
        if build in seen or build in reading.waiting:
            other = seen.get(build) or reading.waiting[build].run.run_id
            reading.told.append((run, f"the same build is in run {other[:8]}; this one waits"))
            return
        reading.waiting[build] = Waiting(run, build, in_process)

    def _holding(
        self, record: dg.RunRecord, builder: str, build: Build | None, reading: TickReading
    ) -> None:
        """A run holding `builder`: its build running there, or a hold of the machine."""
        run = record.dagster_run
        node = next((n for n in self.fleet.nodes if n.builder == builder), None)
        name = node.name if node is not None else f"builder:{builder}"
        started = record.start_time or self.now
        end = from_iso(run.tags.get(ROCM_EST_FINISH_TAG))
        if end is None:
            # Placed by nobody's estimate (an in-process run): the model's figures.
            cost = self._fleet_cost
            work = [build] if build else builds_of_run(self.instance, run, self.graph)
            seconds = sum(
                cost.build_s(b.target, node) + cost.push_s(b.target, node)
                for b in (work if node is not None else [])
            )
            end = started + seconds
        if build is None:
            reading.holds.append(
                Hold(name, started, end, f"{name} is held by run {run.run_id[:8]}")
            )
        else:
            reading.running[build] = Running(name, started, end)

    @cached_property
    def _fleet_cost(self) -> placement.CostModel:
        return placement.CostModel(self.fleet)

    def _materialized(self, run_id: str) -> bool:
        """The run recorded its build's materialization: the bake pushed."""
        found = self.instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION, limit=1
        )
        return bool(found.records)

    def _alive(self, record: dg.RunRecord, lease: float | None) -> bool:
        """A started run is alive while its worker renews its lease (or it just started)."""
        if record.dagster_run.status != dg.DagsterRunStatus.STARTED:
            return True  # queued runs wait; run monitoring watches starting ones
        last = max(lease or 0.0, record.start_time or record.create_timestamp.timestamp())
        return self.now - last <= self.lease_seconds

    def _claimed_by_a_dead_tick(self, run: dg.DagsterRun, lease: float | None) -> bool:
        """A queued run holds a builder it was never tagged placed on: the tick that claimed it
        died (the daemon was killed) between the claim and the tags. A live tick tags at once."""
        return (
            run.status == dg.DagsterRunStatus.QUEUED
            and run.tags.get(ROCM_PLACEMENT_TAG) != PLACEMENT_PLACED
            and self.now - (lease or 0.0) > _UNTAGGED_CLAIM_GRACE_S
        )

    def _build_of(self, run: dg.DagsterRun) -> Build | None:
        text = run.tags.get(ROCM_BUILD_TAG)
        if not text:
            return None
        build = Build.parse(text)
        if build.target not in self.graph.deps:
            raise ValueError(f"{build} is not a build of {self.graph.path.name} any more")
        return build
