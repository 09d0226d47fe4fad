"""The daemon's placement tick: which waiting build runs where, decided once per tick.

Only the queued-run daemon runs it (`PlacementRunCoordinator.get_run_queue_config` checks who is
calling), and an in-process run with no daemon alive, for in-process runs only. Each tick reads
the farm (`rocm_assets.instance.reading`: claims, runs in flight, where recent builds ended and
how, measured durations), decides, then applies the changes through the placement authority
(`rocm_assets.instance.authority`): each placement an atomic builder claim before any tag.

Errors are contained: a run whose own data is wrong fails with a one-line reason, a bad bake or
fleet file keeps every run queued with the reason in its `rocm/waiting_for` tag, and the daemon
keeps ticking.
"""

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg

from rocm_assets.core import placement
from rocm_assets.core.bake import BakeError, BakeGraph
from rocm_assets.core.build.builds import Build, build_deps
from rocm_assets.core.common.constants import (
    PLACEMENT_WAITING,
    ROCM_EST_START_TAG,
    ROCM_PLACEMENT_TAG,
)
from rocm_assets.core.common.timefmt import duration, from_iso, to_iso
from rocm_assets.core.nodes.fleet import Fleet, FleetError, Node
from rocm_assets.core.nodes.foreign import ForeignBuild
from rocm_assets.core.nodes.probes import ProbeCache
from rocm_assets.core.placement.farm import FarmState, PlanView, busy_until
from rocm_assets.core.placement.follow import COORDINATOR_STRATEGY, PlanFollower
from rocm_assets.core.placement.runners import ThreadSolver
from rocm_assets.core.registry.preflight import materialize_command
from rocm_assets.instance import authority
from rocm_assets.instance.drain import BakeDrain
from rocm_assets.instance.foreign import ForeignWatch, unreadable_note
from rocm_assets.instance.history import finished_builds, measured_durations
from rocm_assets.instance.reading import FarmReader, TickReading
from rocm_assets.instance.settings import CoordinatorSettings
from rocm_assets.instance.stored_plan import (
    FOREIGN_KEY,
    PLAN_KEY,
    PlanUnreadable,
    foreign_json,
    plan_json,
    read_plan,
)
from rocm_assets.instance.watched_files import WatchedFiles

logger = logging.getLogger("rocm_assets.instance")

_MEASURED_TTL_S = 300.0
# A waiting run's estimated start is rewritten only when it moved by more than this.
_EST_TAG_SLACK_S = 60.0


@dataclass
class _Situation:
    """What a decision is made from, beside the reading: the usable nodes, costs, inputs."""

    pending: dict[Build, frozenset[Build]]
    nodes: list[Node]
    excluded: dict[str, str | None]
    cost: placement.CostModel
    built_on: Mapping[Build, str]
    unpublished: dict[Build, str]
    # Builds that wait for an input that did not publish, with why; those failed for it.
    held_back: dict[Build, str]
    refused: dict[Build, str]


class Placer:
    """The daemon's placement tick, with what it caches between ticks (files, probes, durations)."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        settings: CoordinatorSettings,
        *,
        files: WatchedFiles,
        probes: ProbeCache,
        probe_first: bool = False,
    ) -> None:
        """`probe_first`: probe the nodes in the tick itself, not in the cache's own thread."""
        self._instance = instance
        self.settings = settings
        self.files = files
        self._probes = probes
        self._probe_first = probe_first and settings.probe_nodes
        self._measured: tuple[float, dict[tuple[str, str, int], float]] = (0.0, {})
        self._last_error: str | None = None
        self._follower: PlanFollower | None = None
        self._stored_plan: tuple[object, ...] | None = None
        # The plan text this daemon last stored, and the last unreadable one it found instead.
        self._written: str | None = None
        self._unreadable: str | None = None
        self._drain = BakeDrain(instance, settings.bake_end_wait_seconds)
        self._foreign = ForeignWatch(
            instance, settings.foreign_check_seconds, settings.foreign_build_seconds
        )
        self._stored_foreign: str | None = None
        # run id -> builders whose unreadable history that waiting run was told of.
        self._told_unreadable: dict[str, set[str]] = {}

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
        self._foreign.close()
        if self._follower is not None:
            self._follower.close()

    def _plan_follower(self) -> PlanFollower:
        if self._follower is None:
            runner = (
                ThreadSolver(workers=self.settings.solver_workers) if self.settings.solver else None
            )
            self._follower = PlanFollower(runner, self.settings.follow)
        return self._follower

    # ---- the tick: read, decide, apply ----
    def tick(
        self, now: float | None = None, max_concurrent_runs: int = -1, in_process_only: bool = False
    ) -> placement.Decision | None:
        """Place every waiting build that can start now; tag the rest with what they wait for.

        Queued runs are placed only as far as the daemon will start them (`max_concurrent_runs`,
        -1 for no limit): a placed run holds its machine until it ends. `in_process_only`: the
        tick of a run placing itself with no daemon alive (`authority.machine_for_build`).
        """
        now = time.time() if now is None else now
        try:
            graph, fleet = self.files.graph(), self.files.fleet()
        except (BakeError, FleetError, OSError) as exc:
            self._hold_everything(f"cannot read the farm's files, nothing is placed: {exc}")
            return None
        if self._probe_first:
            self._probes.probe_now(fleet)
        elif self.settings.probe_nodes:
            self._probes.watch(fleet)
        if in_process_only:
            self._foreign.read_now(fleet)
        else:
            self._foreign.refresh(fleet, now)
        authority.ensure_pools(self._instance, {n.builder for n in fleet.nodes})
        if not in_process_only:
            self._check_stored_plan()
            self._drain.sweep(now)
        reader = FarmReader(self._instance, graph, fleet, self.settings.lease_seconds, now)
        reading = reader.read(self._drain.draining(), in_process_only)
        if reading.waiting and not in_process_only:
            self._foreign.settle(fleet)
        cost = self._cost(graph, fleet, now)
        # Builds that are not this farm's hold their nodes as the farm's own do.
        foreign = self._foreign.builds(fleet, cost, now)
        reading.holds.extend(b.hold(now) for b in foreign)
        if not in_process_only:
            self._store_foreign(foreign)
        self._apply_reading(reading)
        self._tell_unreadable(reading)
        if not reading.waiting:
            return None
        situation = self._situation(reading, graph, fleet, cost, now)
        for build, reason in situation.held_back.items():
            run = reading.waiting[build].run
            if build in situation.refused:
                self._contain(run, authority.refuse, self._instance, run, situation.refused[build])
            else:
                self._wait(run, reason)
        if not situation.nodes and situation.excluded:
            down = "; ".join(f"{n}: {why}" for n, why in sorted(situation.excluded.items()))
            for build in situation.pending:
                self._wait(reading.waiting[build].run, f"no build node answers its probe ({down})")
            return None
        decision = self._decide(reading, situation, now)
        self._apply_decision(decision, reading, situation, fleet, max_concurrent_runs, now)
        return decision

    def _cost(self, graph: BakeGraph, fleet: Fleet, now: float) -> placement.CostModel:
        """The cost model as the nodes' probes and the measured durations stand now."""
        return placement.CostModel(
            fleet,
            probes=[p for p in self._probes.fresh(now).values() if p.ok],
            measured=self._measured_durations(graph, fleet),
        )

    def _situation(
        self,
        reading: TickReading,
        graph: BakeGraph,
        fleet: Fleet,
        cost: placement.CostModel,
        now: float,
    ) -> _Situation:
        """Probes and inputs for the waiting builds; inputs that did not publish hold their
        dependents back (told so, or failed after the bound)."""
        probes = self._probes.fresh(now)
        deps = {b: build_deps(graph, b) for b in reading.waiting}
        outside = (
            {d for ds in deps.values() for d in ds}
            - reading.waiting.keys()
            - reading.running.keys()
            - reading.ending.keys()
        )
        built_on, failed = finished_builds(
            self._instance, outside, {n.name for n in fleet.nodes}, now
        )
        held_back, refused = self._unpublished_inputs(reading, deps, failed, graph, now)
        excluded = {n: p.reason for n, p in probes.items() if not p.ok}
        unpublished = {d: reason for d, (reason, _) in failed.items()}
        unpublished.update(dict.fromkeys(held_back, "it waits for an unpublished input"))
        return _Situation(
            pending={b: deps[b] for b in reading.waiting if b not in held_back},
            nodes=[n for n in fleet.nodes if n.name not in excluded],
            excluded=excluded,
            cost=cost,
            built_on=built_on,
            unpublished=unpublished,
            held_back=held_back,
            refused=refused,
        )

    def _decide(
        self, reading: TickReading, situation: _Situation, now: float
    ) -> placement.Decision:
        if self.settings.strategy != COORDINATOR_STRATEGY:
            return placement.choose_placements(
                list(situation.pending),
                {b: (r.node, r.est_end_s) for b, r in reading.running.items()},
                situation.nodes,
                situation.cost,
                now,
                situation.pending,
                pushed=situation.built_on,
                strategy=self.settings.strategy,
                held=busy_until(reading.holds),
            )
        follower = self._plan_follower()
        decision = follower.tick(
            FarmState(
                now_s=now,
                pending=situation.pending,
                running=reading.running,
                nodes=situation.nodes,
                cost=situation.cost,
                built_on=situation.built_on,
                holds=reading.holds,
                unpublished=situation.unpublished,
            )
        )
        for note in follower.notes():
            logger.warning("placement: %s", note)
        self._store_plan(follower.plan())
        return decision

    def _apply_reading(self, reading: TickReading) -> None:
        """The changes reading found due: dead ticks' claims undone, dead workers' claims
        freed and their runs failed, unplaceable runs failed, the rest told why they wait."""
        for run, builder in reading.undo:
            authority.release(self._instance, run.run_id)
            message = (
                f"builder {builder} was claimed for this run by a placement that never finished "
                "(the daemon died): the claim is undone and the run placed afresh"
            )
            logger.warning("run %s: %s", run.run_id, message)
            self.event(run, message)
        for run, builder in reading.expire:
            authority.release(self._instance, run.run_id)
            message = (
                f"its run worker stopped renewing the claim on builder {builder} for over "
                f"{duration(self.settings.lease_seconds)}: the builder is freed and the run failed"
            )
            logger.warning("run %s: %s", run.run_id, message)
            self._instance.report_run_failed(run, message)
        for run, exc in reading.broken:
            self._refuse_broken(run, exc)
        for run, reason in reading.told:
            self._wait(run, reason)

    def _apply_decision(
        self,
        decision: placement.Decision,
        reading: TickReading,
        situation: _Situation,
        fleet: Fleet,
        max_concurrent_runs: int,
        now: float,
    ) -> None:
        """Claim and tag what starts, as far as the run slots go; tell the rest why they wait."""
        room = -1 if max_concurrent_runs < 0 else max(0, max_concurrent_runs - reading.in_progress)
        for start in decision.starts:
            waiting = reading.waiting[start.build]
            if not waiting.in_process:
                if room == 0:
                    self._wait(waiting.run, "every run slot is taken (max_concurrent_runs)")
                    continue
                room -= 1
            self._contain(
                waiting.run,
                self._place,
                waiting.run,
                start,
                decision.strategy,
                fleet,
                situation,
                now,
            )
        for build, why in decision.waiting.items():
            run = reading.waiting[build].run
            extra = {}
            if why.est_start_s is not None:
                tagged = from_iso(run.tags.get(ROCM_EST_START_TAG))
                if tagged is None or abs(tagged - why.est_start_s) > _EST_TAG_SLACK_S:
                    extra[ROCM_EST_START_TAG] = to_iso(why.est_start_s)
            self._wait(run, why.reason, extra)

    def _store_foreign(self, foreign: list[ForeignBuild]) -> None:
        """Keep the foreign builds where `rocm-assets watch` reads them, when they changed."""
        text = json.dumps(foreign_json(foreign))
        if text == self._stored_foreign:
            return
        self._stored_foreign = text
        self._instance.run_storage.set_cursor_values({FOREIGN_KEY: text})

    def _tell_unreadable(self, reading: TickReading) -> None:
        """Each waiting run hears once of each builder whose history cannot be read."""
        unreadable = self._foreign.unreadable()
        waiting = {w.run.run_id: w.run for w in reading.waiting.values()}
        self._told_unreadable = {
            i: told for i, told in self._told_unreadable.items() if i in waiting
        }
        for run_id, run in waiting.items():
            told = self._told_unreadable.setdefault(run_id, set())
            new = {b: why for b, why in unreadable.items() if b not in told}
            if new:
                told.update(new)
                self.event(
                    run, f"placed as if those builders build nothing else: {unreadable_note(new)}"
                )

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

    # ---- inputs that did not publish ----
    def _unpublished_inputs(
        self,
        reading: TickReading,
        deps: Mapping[Build, frozenset[Build]],
        failed: Mapping[Build, tuple[str, float]],
        graph: BakeGraph,
        now: float,
    ) -> tuple[dict[Build, str], dict[Build, str]]:
        """Builds held back by an input whose last run failed, with why they wait; and those
        to fail, with why, once the bound has passed. An input whose run is ending holds them
        too, until that run says how it ended."""
        held: dict[Build, str] = {}
        refused: dict[Build, str] = {}
        for build in reading.waiting:
            ending = sorted(d for d in deps[build] if d in reading.ending)
            if ending:
                run_id = reading.ending[ending[0]]
                held[build] = f"waits for {ending[0]}: its run {run_id[:8]} is ending"
                continue
            bad = sorted(d for d in deps[build] if d in failed)
            if not bad:
                continue
            dep = bad[0]
            reason, ended = failed[dep]
            command = materialize_command(
                dep.target, dep.arch if dep.target in graph.per_arch else None
            )
            held[build] = f"waits for {dep} to be rebuilt: {reason} ({command})"
            if now - ended >= self.settings.input_wait_seconds:
                waited = (
                    f" and nothing rebuilt it within {duration(self.settings.input_wait_seconds)}"
                    if self.settings.input_wait_seconds > 0
                    else ""
                )
                refused[build] = (
                    f"input {dep} is not published: {reason}{waited}; build it with: {command}"
                )
        # What waits on a held build waits too: a held build is not published either.
        grew = True
        while grew:
            grew = False
            for build in reading.waiting:
                blocked = sorted(d for d in deps[build] if d in held)
                if build not in held and blocked:
                    held[build] = f"waits for {blocked[0]}, which waits for an input"
                    grew = True
        return held, refused

    # ---- the changes, through the authority ----
    def _place(
        self,
        run: dg.DagsterRun,
        start: placement.Start,
        strategy: str,
        fleet: Fleet,
        situation: _Situation,
        now: float,
    ) -> None:
        node = fleet.node(start.node)
        jobs = situation.cost.max_jobs(node)
        if not authority.place(self._instance, run, node, start, jobs, now):
            return  # another run took the machine since the tick read the claims: next tick
        excluded = situation.excluded
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

    def _wait(
        self, run: dg.DagsterRun, reason: str, extra: Mapping[str, str] | None = None
    ) -> None:
        authority.mark_waiting(self._instance, run, reason, extra)

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
            self._wait(record.dagster_run, reason)

    def _refuse_broken(self, run: dg.DagsterRun, exc: Exception) -> None:
        """A run that cannot be placed fails with a one-line reason instead of the daemon."""
        message = f"rocm-assets could not place this run: {type(exc).__name__}: {exc}"
        message = " ".join(message.split())[:500]
        logger.error("run %s: %s", run.run_id, message, exc_info=exc)
        authority.refuse(self._instance, run, message)

    def _contain(self, run: dg.DagsterRun, fn: Any, *args: Any) -> None:
        """Run `fn`; an exception fails `run` with a one-line reason instead of the daemon."""
        try:
            fn(*args)
        except Exception as exc:
            self._refuse_broken(run, exc)

    def event(self, run: dg.DagsterRun, message: str) -> None:
        self._instance.report_engine_event(message, run)
