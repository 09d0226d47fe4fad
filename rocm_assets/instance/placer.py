"""The placement authority: the daemon's tick that decides which waiting build runs where.

Only the queued-run daemon runs it (`PlacementRunCoordinator.get_run_queue_config` checks who is
calling). Each tick reads the farm from the instance: builder claims (who holds which machine),
runs in flight, where recent builds ended and how, measured durations; then it places what can
start, each placement an atomic builder claim (`rocm_assets.instance.claims`) before any tag is
written. In-process runs (`dagster asset materialize`) wait in the same line: their worker tags
itself waiting and the tick places it like a queued run.

Errors are contained: a run whose own data is wrong fails with a one-line reason, a bad bake or
fleet file keeps every run queued with the reason in its `rocm/waiting_for` tag, and the daemon
keeps ticking.
"""

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from rocm_assets.core import placement
from rocm_assets.core.bake import BakeError, BakeGraph
from rocm_assets.core.build.builds import Build, build_deps
from rocm_assets.core.build.guard import GRACE_S
from rocm_assets.core.common.constants import (
    PLACEMENT_PLACED,
    PLACEMENT_WAITING,
    ROCM_BUILD_TAG,
    ROCM_BUILDER_TAG,
    ROCM_EST_FINISH_TAG,
    ROCM_EST_START_TAG,
    ROCM_MAX_JOBS_TAG,
    ROCM_NODE_TAG,
    ROCM_PLACEMENT_TAG,
    ROCM_REFUSED_TAG,
    ROCM_WAITING_FOR_TAG,
)
from rocm_assets.core.common.timefmt import duration, from_iso, to_iso
from rocm_assets.core.nodes.fleet import Fleet, FleetError
from rocm_assets.core.nodes.probes import ProbeCache
from rocm_assets.core.placement.farm import FarmState, FollowSettings, PlanView, Running
from rocm_assets.core.placement.follow import COORDINATOR_STRATEGY, PlanFollower
from rocm_assets.core.placement.runners import ThreadSolver
from rocm_assets.core.registry.preflight import materialize_command
from rocm_assets.instance import claims
from rocm_assets.instance.drain import BakeDrain
from rocm_assets.instance.farm_files import FarmFiles
from rocm_assets.instance.history import finished_builds, measured_durations
from rocm_assets.instance.runs import IN_FLIGHT_STATUSES, builds_of_run
from rocm_assets.instance.stored_plan import PLAN_KEY, PlanUnreadable, plan_json, read_plan

logger = logging.getLogger("rocm_assets.instance")

_MEASURED_TTL_S = 300.0
# How long a cancelled bake is expected to take to end: the bake guard's grace, and some.
_ENDING_BAKE_S = GRACE_S + 10.0


# A waiting run's estimated start is rewritten only when it moved by more than this.
_EST_TAG_SLACK_S = 60.0
# A tick tags a run placed right after claiming its builder; a claim left untagged this long
# was made by a tick that died.
_UNTAGGED_CLAIM_GRACE_S = 30.0


@dataclass(frozen=True)
class PlacerSettings:
    strategy: str = COORDINATOR_STRATEGY
    follow: FollowSettings = field(default_factory=FollowSettings)
    # False, or OR-Tools missing: the follower plans with the heuristics alone.
    solver: bool = True
    # CP-SAT threads beside the daemon; one leaves the other cores to the daemon and the UI.
    solver_workers: int = 1
    probe_nodes: bool = True
    # A started run whose worker has not renewed its claim's lease for this long is dead.
    lease_seconds: float = 300.0
    # How long a build waits on an input whose last run failed or was cancelled before failing;
    # 0: it fails at once, naming the input and that run.
    input_wait_seconds: float = 0.0
    # The longest a run that ended holding its builder keeps it while BuildKit still shows its
    # bake running there (or cannot be read).
    bake_end_wait_seconds: float = 60.0


@dataclass
class _Waiting:
    run: dg.DagsterRun
    build: Build
    in_process: bool


@dataclass
class _Farm:
    """What one tick knows: waiting builds, what holds each machine, and finished inputs."""

    waiting: dict[Build, _Waiting] = field(default_factory=dict)
    # build -> (node, started, estimated end)
    running: dict[Build, tuple[str, float, float]] = field(default_factory=dict)
    # build -> run id: its bake is over (the builder is freed) but its run has not recorded a
    # materialization: not yet known published or failed.
    ending: dict[Build, str] = field(default_factory=dict)
    in_progress: int = 0


class Placer:
    """The daemon's placement tick, with what it caches between ticks (files, probes, durations)."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        settings: PlacerSettings,
        *,
        files: "FarmFiles",
        probes: ProbeCache,
    ) -> None:
        self._instance = instance
        self.settings = settings
        self.files = files
        self._probes = probes
        self._measured: tuple[float, dict[tuple[str, str, int], float]] = (0.0, {})
        self._last_error: str | None = None
        self._follower: PlanFollower | None = None
        self._stored_plan: tuple[object, ...] | None = None
        # The plan text this daemon last stored, and the last unreadable one it found instead.
        self._written: str | None = None
        self._unreadable: str | None = None
        self._drain = BakeDrain(instance, settings.bake_end_wait_seconds)

    def _measured_durations(
        self, graph: BakeGraph, fleet: Fleet
    ) -> dict[tuple[str, str, int], float]:
        stamp, cached = self._measured
        if time.time() - stamp >= _MEASURED_TTL_S:
            cached = measured_durations(self._instance, graph, fleet)
            self._measured = (time.time(), cached)
        return cached

    def close(self) -> None:
        self._drain.close()
        if self._follower is not None:
            self._follower.close()

    def _plan_follower(self) -> PlanFollower:
        if self._follower is None:
            runner = (
                ThreadSolver(workers=self.settings.solver_workers) if self.settings.solver else None
            )
            self._follower = PlanFollower(runner, self.settings.follow)
        return self._follower

    # ---- the tick ----
    def tick(
        self, now: float | None = None, max_concurrent_runs: int = -1
    ) -> placement.Decision | None:
        """Place every waiting build that can start now; tag the rest with what they wait for.

        Queued runs are placed only as far as the daemon will start them (`max_concurrent_runs`,
        -1 for no limit): a placed run holds its machine until it ends.
        """
        now = time.time() if now is None else now
        try:
            graph, fleet = self.files.graph(), self.files.fleet()
        except (BakeError, FleetError, OSError) as exc:
            self._hold_everything(f"cannot read the farm's files, nothing is placed: {exc}")
            return None
        self._check_stored_plan()
        if self.settings.probe_nodes:
            self._probes.watch(fleet)
        claims.ensure_builder_pools(self._instance, {n.builder for n in fleet.nodes})
        self._drain.sweep(now)
        farm = self._read_farm(graph, fleet, now)
        if not farm.waiting:
            return None
        probes = self._probes.fresh(now)
        excluded = {n: p.reason for n, p in probes.items() if not p.ok}
        cost = placement.CostModel(
            fleet,
            probes=[p for p in probes.values() if p.ok],
            measured=self._measured_durations(graph, fleet),
        )
        deps = {b: build_deps(graph, b) for b in farm.waiting}
        outside = (
            {d for ds in deps.values() for d in ds}
            - farm.waiting.keys()
            - farm.running.keys()
            - farm.ending.keys()
        )
        built_on, failed = finished_builds(
            self._instance, outside, {n.name for n in fleet.nodes}, now
        )
        held_back = self._hold_for_unpublished(farm, deps, failed, graph, now)
        pending = {b: deps[b] for b in farm.waiting if b not in held_back}
        nodes = [n for n in fleet.nodes if n.name not in excluded]
        if not nodes and excluded:
            down = "; ".join(f"{n}: {why}" for n, why in sorted(excluded.items()))
            for build in pending:
                self._tag_waiting(
                    farm.waiting[build].run, f"no build node answers its probe ({down})"
                )
            return None
        if self.settings.strategy == COORDINATOR_STRATEGY:
            decision = self._follow(farm, pending, nodes, cost, built_on, failed, held_back, now)
        else:
            decision = placement.choose_placements(
                list(pending),
                {b: (node, end) for b, (node, _, end) in farm.running.items()},
                nodes,
                cost,
                now,
                pending,
                pushed=built_on,
                strategy=self.settings.strategy,
            )
        room = -1 if max_concurrent_runs < 0 else max(0, max_concurrent_runs - farm.in_progress)
        for start in decision.starts:
            waiting = farm.waiting[start.build]
            if not waiting.in_process:
                if room == 0:
                    self._tag_waiting(waiting.run, "every run slot is taken (max_concurrent_runs)")
                    continue
                room -= 1
            self._contain(
                waiting.run,
                self._place,
                waiting.run,
                start,
                decision.strategy,
                fleet,
                cost,
                excluded,
                now,
            )
        for build, why in decision.waiting.items():
            run = farm.waiting[build].run
            extra = {}
            if why.est_start_s is not None:
                tagged = from_iso(run.tags.get(ROCM_EST_START_TAG))
                if tagged is None or abs(tagged - why.est_start_s) > _EST_TAG_SLACK_S:
                    extra[ROCM_EST_START_TAG] = to_iso(why.est_start_s)
            self._tag_waiting(run, why.reason, extra)
        return decision

    def _follow(
        self,
        farm: "_Farm",
        pending: Mapping[Build, frozenset[Build]],
        nodes: list[Any],
        cost: placement.CostModel,
        built_on: Mapping[Build, str],
        failed: Mapping[Build, tuple[str, float]],
        held_back: set[Build],
        now: float,
    ) -> placement.Decision:
        """The plan follower's tick: start what the followed plan starts now."""
        follower = self._plan_follower()
        running, busy = {}, {}
        for build, (node, started, end) in farm.running.items():
            if build.target.startswith("run:"):
                busy[node] = max(end, busy.get(node, 0.0))  # a machine held outside the plan
            else:
                running[build] = Running(node, started, end)
        unpublished = {d: reason for d, (reason, _) in failed.items()}
        unpublished.update({b: "it waits for an unpublished input" for b in held_back})
        state = FarmState(
            now_s=now,
            pending=pending,
            running=running,
            nodes=nodes,
            cost=cost,
            built_on=built_on,
            busy=busy,
            unpublished=unpublished,
        )
        decision = follower.tick(state)
        for note in follower.notes():
            logger.warning("placement: %s", note)
        self._store_plan(follower.plan())
        return decision

    def _store_plan(self, view: PlanView | None) -> None:
        """Keep the followed plan where `rocm-assets watch` reads it, when it changed."""
        if view is None:
            return
        key = (view.generation, view.strategy, view.solver, view.makespan_s)
        if key == self._stored_plan:
            return
        self._stored_plan = key
        self._written = json.dumps(plan_json(view))
        self._instance.run_storage.set_cursor_values({PLAN_KEY: self._written})

    def _check_stored_plan(self) -> None:
        """A stored plan this daemon did not write and nobody can read (overwritten by hand or
        by another version): said once, and the plan is made again and stored over it."""
        stored = self._instance.run_storage.get_cursor_values({PLAN_KEY}).get(PLAN_KEY)
        if stored is None or stored in (self._written, self._unreadable):
            return
        try:
            read_plan(stored)
        except PlanUnreadable as exc:
            self._unreadable = stored
            self._stored_plan = None
            logger.warning(
                "placement: the stored plan %s is unreadable, re-planning: %s", PLAN_KEY, exc
            )
            if self._follower is not None:
                self._follower.replan(f"the stored plan was unreadable: {exc}")

    def _read_farm(self, graph: BakeGraph, fleet: Fleet, now: float) -> _Farm:
        """Runs in flight, sorted into waiting builds and builds holding a machine."""
        farm = _Farm()
        held = claims.claims(self._instance)
        holder_of = {run_id: builder for builder, run_id in held.items()}
        by_builder = {n.builder: n for n in fleet.nodes}
        records = self._instance.get_run_records(dg.RunsFilter(statuses=list(IN_FLIGHT_STATUSES)))
        # Started runs renew their lease; a queued one has one from the tick that claimed for it.
        leased = [
            r.dagster_run.run_id
            for r in records
            if r.dagster_run.status == dg.DagsterRunStatus.STARTED
            or r.dagster_run.run_id in holder_of
        ]
        lease = claims.leases(self._instance, leased)
        seen: dict[Build, str] = {}
        fleet_cost = placement.CostModel(fleet)
        for record in records:
            run = record.dagster_run
            if run.status != dg.DagsterRunStatus.QUEUED:
                farm.in_progress += 1
            builder = holder_of.get(run.run_id)
            if builder is not None and self._claimed_by_a_dead_tick(
                run, lease.get(run.run_id), now
            ):
                self._undo_claim(run, builder)
                builder = None
            alive = self._alive(record, lease.get(run.run_id), now)
            if builder is not None and not alive:
                self._expire(run, builder)
                continue
            build = self._contain(run, self._build_of, run, graph)
            if builder is not None:
                node = by_builder.get(builder)
                name = node.name if node is not None else f"builder:{builder}"
                end = from_iso(run.tags.get(ROCM_EST_FINISH_TAG))
                if end is None:
                    # Placed by nobody's estimate (an in-process run): the model's figures.
                    work = [build] if build else builds_of_run(self._instance, run, graph)
                    seconds = sum(
                        fleet_cost.build_s(b.target, node) + fleet_cost.push_s(b.target, node)
                        for b in (work if node is not None else [])
                    )
                    end = (record.start_time or now) + seconds
                started = record.start_time or now
                farm.running[build or Build(f"run:{run.run_id}")] = (name, started, end)
                if build is not None:
                    seen[build] = run.run_id
                continue
            if (
                build is not None
                and run.status != dg.DagsterRunStatus.QUEUED
                and run.tags.get(ROCM_PLACEMENT_TAG) == PLACEMENT_PLACED
            ):
                # The build resource frees the builder when the bake ends, before the run
                # records how: a failed input must not pass for a published one meanwhile.
                if not self._materialized(run.run_id):
                    farm.ending[build] = run.run_id
                continue
            if build is None or run.tags.get(ROCM_PLACEMENT_TAG) != PLACEMENT_WAITING:
                continue
            in_process = run.status == dg.DagsterRunStatus.STARTED
            if run.status != dg.DagsterRunStatus.QUEUED and not (in_process and alive):
                continue
            if build in seen or build in farm.waiting:
                other = seen.get(build) or farm.waiting[build].run.run_id
                self._tag_waiting(run, f"the same build is in run {other[:8]}; this one waits")
                continue
            farm.waiting[build] = _Waiting(run, build, in_process)
        # A machine an ended run still holds: its bake is ending there (the drain frees it).
        for builder, (run_id, ended) in self._drain.draining().items():
            node = by_builder.get(builder)
            name = node.name if node is not None else f"builder:{builder}"
            end = max(ended + _ENDING_BAKE_S, now + 1.0)
            farm.running[Build(f"run:{run_id}")] = (name, ended, end)
        # A build both running and waiting: the waiting request runs after it.
        for build in [b for b in farm.waiting if b in farm.running]:
            run = farm.waiting.pop(build).run
            self._tag_waiting(run, f"{build} is building on {farm.running[build][0]}")
        return farm

    def _materialized(self, run_id: str) -> bool:
        """The run recorded its build's materialization: the bake pushed."""
        found = self._instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION, limit=1
        )
        return bool(found.records)

    def _alive(self, record: dg.RunRecord, lease: float | None, now: float) -> bool:
        """A started run is alive while its worker renews its lease (or it just started)."""
        if record.dagster_run.status != dg.DagsterRunStatus.STARTED:
            return True  # queued runs wait; run monitoring watches starting ones
        last = max(lease or 0.0, record.start_time or record.create_timestamp.timestamp())
        return now - last <= self.settings.lease_seconds

    def _claimed_by_a_dead_tick(self, run: dg.DagsterRun, lease: float | None, now: float) -> bool:
        """A queued run holds a builder it was never tagged placed on: the tick that claimed it
        died (the daemon was killed) between the claim and the tags. A live tick tags at once."""
        return (
            run.status == dg.DagsterRunStatus.QUEUED
            and run.tags.get(ROCM_PLACEMENT_TAG) != PLACEMENT_PLACED
            and now - (lease or 0.0) > _UNTAGGED_CLAIM_GRACE_S
        )

    def _undo_claim(self, run: dg.DagsterRun, builder: str) -> None:
        claims.release_run(self._instance, run.run_id)
        message = (
            f"builder {builder} was claimed for this run by a placement that never finished "
            "(the daemon died): the claim is undone and the run placed afresh"
        )
        logger.warning("run %s: %s", run.run_id, message)
        self.event(run, message)

    def _expire(self, run: dg.DagsterRun, builder: str) -> None:
        claims.release_run(self._instance, run.run_id)
        message = (
            f"its run worker stopped renewing the claim on builder {builder} for over "
            f"{duration(self.settings.lease_seconds)}: the builder is freed and the run failed"
        )
        logger.warning("run %s: %s", run.run_id, message)
        self._instance.report_run_failed(run, message)

    def _build_of(self, run: dg.DagsterRun, graph: BakeGraph) -> Build | None:
        text = run.tags.get(ROCM_BUILD_TAG)
        if not text:
            return None
        build = Build.parse(text)
        if build.target not in graph.deps:
            raise ValueError(f"{build} is not a build of {graph.path.name} any more")
        return build

    # ---- inputs that did not publish ----
    def _hold_for_unpublished(
        self,
        farm: _Farm,
        deps: Mapping[Build, frozenset[Build]],
        failed: Mapping[Build, tuple[str, float]],
        graph: BakeGraph,
        now: float,
    ) -> set[Build]:
        """Builds with an input whose last run failed: they wait, then fail after a bound. An
        input whose run is ending holds them too, until that run says how it ended."""
        held: set[Build] = set()
        for build, waiting in farm.waiting.items():
            ending = sorted(d for d in deps[build] if d in farm.ending)
            if ending:
                held.add(build)
                run_id = farm.ending[ending[0]]
                self._tag_waiting(
                    waiting.run, f"waits for {ending[0]}: its run {run_id[:8]} is ending"
                )
                continue
            bad = sorted(d for d in deps[build] if d in failed)
            if not bad:
                continue
            held.add(build)
            dep = bad[0]
            reason, ended = failed[dep]
            command = materialize_command(
                dep.target, dep.arch if dep.target in graph.per_arch else None
            )
            if now - ended < self.settings.input_wait_seconds:
                self._tag_waiting(
                    waiting.run, f"waits for {dep} to be rebuilt: {reason} ({command})"
                )
                continue
            waited = (
                f" and nothing rebuilt it within {duration(self.settings.input_wait_seconds)}"
                if self.settings.input_wait_seconds > 0
                else ""
            )
            message = f"input {dep} is not published: {reason}{waited}; build it with: {command}"
            self._contain(waiting.run, self._refuse, waiting, message)
        # What waits on a held build waits too: a held build is not published either.
        grew = True
        while grew:
            grew = False
            for build, waiting in farm.waiting.items():
                if build in held:
                    continue
                blocked = sorted(d for d in deps[build] if d in held)
                if blocked:
                    held.add(build)
                    grew = True
                    self._tag_waiting(
                        waiting.run, f"waits for {blocked[0]}, which waits for an input"
                    )
        return held

    def _refuse(self, waiting: _Waiting, message: str) -> None:
        if waiting.in_process:
            # The worker is alive and waiting: it fails its own step with the reason.
            self._instance.add_run_tags(waiting.run.run_id, {ROCM_REFUSED_TAG: message[:1000]})
        else:
            self._instance.report_run_failed(waiting.run, message)

    # ---- applying the decision ----
    def _place(
        self,
        run: dg.DagsterRun,
        start: placement.Start,
        strategy: str,
        fleet: Fleet,
        cost: placement.CostModel,
        excluded: Mapping[str, str | None],
        now: float,
    ) -> None:
        node = fleet.node(start.node)
        if not claims.claim_builder(self._instance, node.builder, run.run_id):
            # Someone took the machine since the tick read the claims: try again next tick.
            self._tag_waiting(run, f"builder {node.builder} was just claimed by another run")
            return
        claims.renew_lease(self._instance, run.run_id, now)
        jobs = cost.max_jobs(node)
        self._instance.add_run_tags(
            run.run_id,
            {
                ROCM_NODE_TAG: node.name,
                ROCM_BUILDER_TAG: node.builder,
                ROCM_PLACEMENT_TAG: PLACEMENT_PLACED,
                ROCM_MAX_JOBS_TAG: str(jobs),
                ROCM_EST_START_TAG: to_iso(start.est_start_s),
                ROCM_EST_FINISH_TAG: to_iso(start.est_finish_s),
                ROCM_WAITING_FOR_TAG: "",
            },
        )
        skipped = (
            f"; excluded: {', '.join(f'{n} ({r})' for n, r in excluded.items())}"
            if excluded
            else ""
        )
        self.event(
            run,
            f"placed {start.build} on {node.name} (builder {node.builder} claimed, MAX_JOBS "
            f"~{jobs}), estimated finish {to_iso(start.est_finish_s)}, by the {strategy} "
            f"plan{skipped}",
        )

    def _tag_waiting(
        self, run: dg.DagsterRun, reason: str, extra: Mapping[str, str] | None = None
    ) -> None:
        wanted = {ROCM_WAITING_FOR_TAG: reason[:255], **(extra or {})}
        # Only write what changed: the daemon ticks every few seconds.
        if any(run.tags.get(k) != v for k, v in wanted.items()):
            self._instance.add_run_tags(run.run_id, wanted)

    def _hold_everything(self, reason: str) -> None:
        if reason != self._last_error:
            logger.error("placement: %s", reason)
        self._last_error = reason
        records = self._instance.get_run_records(
            dg.RunsFilter(
                statuses=[dg.DagsterRunStatus.QUEUED], tags={ROCM_PLACEMENT_TAG: PLACEMENT_WAITING}
            )
        )
        for record in records:
            self._tag_waiting(record.dagster_run, reason)

    def _contain(self, run: dg.DagsterRun, fn: Any, *args: Any) -> Any:
        """Run `fn`; an exception fails `run` with a one-line reason instead of the daemon."""
        try:
            return fn(*args)
        except Exception as exc:
            message = f"rocm-assets could not place this run: {type(exc).__name__}: {exc}"
            message = " ".join(message.split())[:500]
            logger.exception("run %s: %s", run.run_id, message)
            if run.status == dg.DagsterRunStatus.STARTED:
                self._instance.add_run_tags(run.run_id, {ROCM_REFUSED_TAG: message})
            else:
                self._instance.report_run_failed(run, message)
            return None

    def event(self, run: dg.DagsterRun, message: str) -> None:
        self._instance.report_engine_event(message, run)
