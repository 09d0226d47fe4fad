"""The placement authority: every change to who holds which machine, and to a run's placement.

A machine is held through a builder claim (`rocm_assets.instance.claims`, one conditional UPDATE
in the instance's storage) renewed by a lease while the holder lives. This module is the only
one that takes, renews or frees a claim, and the only writer of the placement tags
(`rocm/placement`, `rocm/node`, `rocm/builder`, `rocm/waiting_for`). Its callers:

- the coordinator's submission blanks the placement tags a submitter supplied
  (`blank_supplied`) and queues a build run (`queue`);
- the daemon's tick (`rocm_assets.instance.placer`) places (`place`), tags what waits
  (`mark_waiting`) and frees the claims of dead runs (`release`);
- the drain keeps an ended run's machine while its bake ends, then frees it (`keep_for_bake`,
  `free_builder`);
- a build run holds its machine for its bake (`machine_for_build`): placed by the daemon, or
  waiting in line like a queued run; with no placement daemon alive, it runs the placer's own
  tick itself, for in-process runs only (`_OwnTick`). A GPU test holds a given machine
  (`machine_for_test`).
"""

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import dagster as dg

from rocm_assets.core import placement
from rocm_assets.core.build.builds import Build
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
    ROCM_TAG_PREFIX,
    ROCM_WAITING_FOR_TAG,
)
from rocm_assets.core.common.text import bounded
from rocm_assets.core.common.timefmt import duration, to_iso
from rocm_assets.core.nodes.fleet import Fleet, Node, fleet_path
from rocm_assets.core.nodes.probes import probe_node
from rocm_assets.instance import claims
from rocm_assets.instance.foreign import ForeignWatch
from rocm_assets.instance.settings import CoordinatorSettings

logger = logging.getLogger("rocm_assets.instance")

# Tags that once placed a run by themselves; they are only logged as ignored now.
_SELF_PLACED_TAGS = (ROCM_NODE_TAG, ROCM_MAX_JOBS_TAG, ROCM_BUILDER_TAG)
# The queued-run daemon heartbeats every 30 s; older than this, nobody places waiting runs.
_DAEMON_HEARTBEAT_MAX_AGE_S = 120.0
_LEASE_RENEW_S = 30.0
# A worker waiting out a build not of this farm looks again this often, and says so this often.
_FOREIGN_POLL_S = 2.0
_FOREIGN_SAY_S = 300.0


# ---- the tags ----
def queue(instance: dg.DagsterInstance, run_id: str, build: Build) -> None:
    """A build run enters the line: placed by the daemon's tick when it can start."""
    instance.add_run_tags(
        run_id,
        {
            ROCM_BUILD_TAG: str(build),
            ROCM_PLACEMENT_TAG: PLACEMENT_WAITING,
            ROCM_NODE_TAG: "",
            ROCM_WAITING_FOR_TAG: "placement at dequeue time",
        },
    )


def blank_supplied(instance: dg.DagsterInstance, run: dg.DagsterRun) -> dict[str, str]:
    """Blank the `rocm/` tags a submitter supplied (they are the coordinator's); those blanked."""
    supplied = {k: v for k, v in run.tags.items() if k.startswith(ROCM_TAG_PREFIX) and v}
    if supplied:
        instance.add_run_tags(run.run_id, dict.fromkeys(supplied, ""))
    return supplied


def mark_waiting(
    instance: dg.DagsterInstance,
    run: dg.DagsterRun,
    reason: str,
    extra: Mapping[str, str] | None = None,
) -> None:
    """Say what `run` waits for; only what changed is written (the daemon ticks every second)."""
    wanted = {ROCM_WAITING_FOR_TAG: reason[:255], **(extra or {})}
    if any(run.tags.get(k) != v for k, v in wanted.items()):
        instance.add_run_tags(run.run_id, wanted)


def place(
    instance: dg.DagsterInstance,
    run: dg.DagsterRun,
    node: Node,
    start: placement.Start,
    jobs: int,
    now: float,
) -> bool:
    """Claim `node`'s builder for `run` and tag it placed there; False (and the run told why)
    when another run took the builder since the tick read the claims."""
    if not claims.claim_builder(instance, node.builder, run.run_id):
        mark_waiting(instance, run, f"builder {node.builder} was just claimed by another run")
        return False
    claims.renew_lease(instance, run.run_id, now)
    instance.add_run_tags(
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
    return True


def refuse(instance: dg.DagsterInstance, run: dg.DagsterRun, message: str) -> None:
    """`run` will not be placed: a queued one fails; a started one (in-process, its worker alive
    and waiting) is told, and fails its own step with the reason."""
    if run.status == dg.DagsterRunStatus.STARTED:
        instance.add_run_tags(run.run_id, {ROCM_REFUSED_TAG: message[:1000]})
    else:
        instance.report_run_failed(run, message)


# ---- the claims ----
def ensure_pools(instance: dg.DagsterInstance, builders: Iterable[str]) -> None:
    """Every builder has its one-slot pool (an existing one keeps its holder)."""
    claims.ensure_builder_pools(instance, builders)


def release(instance: dg.DagsterInstance, run_id: str) -> int:
    """Free every machine `run_id` holds and end its lease; how many were freed."""
    return claims.release_run(instance, run_id)


def keep_for_bake(instance: dg.DagsterInstance, run_id: str) -> None:
    """An ended run's machine stays held while its bake may still run there: out of Dagster's
    own sweep, freed only by `free_builder` or `release`."""
    claims.keep_from_dagster(instance, run_id)


def free_builder(instance: dg.DagsterInstance, builder: str, run_id: str) -> bool:
    """Free `builder` if `run_id` still holds it; whether it did."""
    return claims.release_claim(instance, builder, run_id)


def settings_of(instance: dg.DagsterInstance) -> CoordinatorSettings:
    """The placement coordinator's settings, or the defaults when the instance runs another."""
    configured = getattr(instance.run_coordinator, "settings", None)
    return configured if isinstance(configured, CoordinatorSettings) else CoordinatorSettings()


def placement_daemon_alive(instance: dg.DagsterInstance) -> bool:
    """The instance's queued-run daemon runs rocm-assets' coordinator and beat recently."""
    if not isinstance(getattr(instance.run_coordinator, "settings", None), CoordinatorSettings):
        return False
    beat = instance.get_daemon_heartbeats().get("QUEUED_RUN_COORDINATOR")
    return beat is not None and time.time() - beat.timestamp <= _DAEMON_HEARTBEAT_MAX_AGE_S


class LeaseKeeper:
    """Renews `run_id`'s lease while a bake runs, so the daemon knows its worker lives."""

    def __init__(self, instance: dg.DagsterInstance, run_id: str) -> None:
        self._instance, self._run_id = instance, run_id
        lease_s = settings_of(instance).lease_seconds
        self._every_s = min(_LEASE_RENEW_S, max(lease_s / 5, 0.5))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rocm-lease", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._every_s):
            claims.renew_lease(self._instance, self._run_id, time.time())

    def __enter__(self) -> "LeaseKeeper":
        claims.renew_lease(self._instance, self._run_id, time.time())
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()


# ---- a run's own machine ----
@dataclass(frozen=True)
class Machine:
    """The machine a run holds for its bake, and MAX_JOBS there with where it came from."""

    node: Node
    jobs: int
    jobs_from: str


@contextmanager
def machine_for_build(
    context: dg.AssetExecutionContext,
    build: Build,
    fleet: Fleet,
    fleet_file: str | None,
    poll_s: float,
) -> Iterator[Machine]:
    """Hold this run's machine for the bake of `build`, and free it when the bake is over (the
    daemon frees it too if the worker dies).

    A run the coordinator placed already holds its builder. Any other run (an in-process
    `dagster asset materialize`, or one whose claim the daemon has not made yet) tags itself
    waiting and waits in line: the daemon's tick places it by the same rules as a queued run, or,
    with no placement daemon alive, the run runs that tick itself. Placement tags are never read
    here: only the claim says where.
    """
    instance, run_id = context.instance, context.run.run_id
    shared = claims.supported(instance)
    try:
        if shared:
            node = _held_node(context, build, fleet, fleet_file, poll_s)
        else:
            # An in-memory instance (`dg.materialize` in a script): nothing else shares it.
            node = _node_for_a_lone_run(context, build, fleet, poll_s)
        clear_of_foreign_builds(context, node, fleet)
        probe = probe_node(node)
        jobs = placement.max_jobs(node, probe)
        # What this build uses, for the UI and watch; never read back to decide anything.
        instance.add_run_tags(run_id, {ROCM_MAX_JOBS_TAG: str(jobs)})
        source = (
            "its probe"
            if probe.ok and probe.probed
            else f"the fleet's figures ({probe.reason or 'no ssh address'})"
        )
        with LeaseKeeper(instance, run_id):
            yield Machine(node, jobs, source)
    finally:
        if shared:
            release(instance, run_id)


def clear_of_foreign_builds(
    context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext, node: Node, fleet: Fleet
) -> None:
    """Just before the bake, look at the node once more: a build not of this farm that started
    there after placement is waited out, the claim kept (docs/reliability.md: the window left)."""
    instance, run_id = context.instance, context.run.run_id
    settings = settings_of(instance)
    if settings.foreign_check_seconds <= 0:
        return
    watch = ForeignWatch(instance, settings.foreign_check_seconds, settings.foreign_build_seconds)
    cost = placement.CostModel(fleet)
    began = said = time.time()
    told = False
    while True:
        try:
            builds = watch.read_node(node, fleet, cost)
        except Exception as exc:
            context.log.warning(
                "cannot read builder %s's BuildKit history before the bake, so a build there "
                "that is not this farm's would not be seen; baking: %s",
                node.builder,
                bounded(str(exc), 300),
            )
            return
        now = time.time()
        if not builds:
            if told:
                context.log.info(
                    "the build that is not this farm's on %s has ended after %s; baking now",
                    node.name,
                    duration(now - began),
                )
            return
        if not told or now - said >= _FOREIGN_SAY_S:
            context.log.warning(
                "%s; it started after this run was placed: builder %s stays claimed for this run, "
                "which bakes once it ends",
                builds[-1].what(now),
                node.builder,
            )
            told, said = True, now
        if claims.supported(instance):
            claims.renew_lease(instance, run_id, now)
        time.sleep(_FOREIGN_POLL_S)


def _held_node(
    context: dg.AssetExecutionContext,
    build: Build,
    fleet: Fleet,
    fleet_file: str | None,
    poll_s: float,
) -> Node:
    """The node whose builder this run holds: `fleet`, as the run read `fleet_file`."""
    instance, run_id = context.instance, context.run.run_id
    builder = claims.builder_of(instance, run_id)
    if builder is None:
        supplied = {k: v for k, v in context.run.tags.items() if k in _SELF_PLACED_TAGS and v}
        if supplied:
            context.log.warning(
                "ignoring placement tags this run carries (%s): the coordinator places builds",
                ", ".join(f"{k}={v}" for k, v in sorted(supplied.items())),
            )
        builder = _wait_in_line(context, build, fleet, poll_s)
    node = next((n for n in fleet.nodes if n.builder == builder), None)
    if node is None:
        raise dg.Failure(
            description=f"builder {builder} was claimed for this run but is no longer in "
            f"{fleet_path(fleet_file)}: nothing was built"
        )
    return node


def _wait_in_line(
    context: dg.AssetExecutionContext, build: Build, fleet: Fleet, poll_s: float
) -> str:
    """Wait, tagged waiting, until a placement claims a builder for this run; its builder."""
    instance, run_id = context.instance, context.run.run_id
    instance.add_run_tags(
        run_id,
        {
            ROCM_BUILD_TAG: str(build),
            ROCM_PLACEMENT_TAG: PLACEMENT_WAITING,
            ROCM_WAITING_FOR_TAG: "a builder: placed by the coordinator",
            ROCM_NODE_TAG: "",
            ROCM_BUILDER_TAG: "",
        },
    )
    ensure_pools(instance, {n.builder for n in fleet.nodes})
    own_tick = _OwnTick(context, build, fleet)
    last_said = ""
    try:
        while True:
            claims.renew_lease(instance, run_id, time.time())
            builder = claims.builder_of(instance, run_id)
            if builder is None and not placement_daemon_alive(instance):
                own_tick.place()
                builder = claims.builder_of(instance, run_id)
            if builder is not None:
                return builder
            run = instance.get_run_by_id(run_id)
            refused = run.tags.get(ROCM_REFUSED_TAG) if run else None
            if refused:
                raise dg.Failure(description=refused)
            waiting_for = (run.tags.get(ROCM_WAITING_FOR_TAG) if run else "") or "placement"
            held = claims.claims(instance)
            said = (
                f"waiting in line for a builder: {waiting_for} "
                f"({len(held)} of {len(fleet.nodes)} held)"
            )
            if said != last_said:
                context.log.info(said)
                last_said = said
            time.sleep(poll_s)
    finally:
        own_tick.close()


class _OwnTick:
    """With no placement daemon alive, a waiting in-process run places in-process runs itself.

    On an instance running rocm-assets' coordinator it runs the placer's own tick (the
    coordinator's `in_process_placer`: heuristics only, the nodes probed right before each
    decision). An instance with another coordinator has no placer: the run then takes the node
    the core decision picks for it alone, among the free nodes that answer their probe.
    """

    def __init__(self, context: dg.AssetExecutionContext, build: Build, fleet: Fleet) -> None:
        self._context, self._build, self._fleet = context, build, fleet
        self._placer: Any = None

    def place(self) -> None:
        make = getattr(self._context.instance.run_coordinator, "in_process_placer", None)
        if make is None:
            _place_alone(self._context, self._build, self._fleet)
            return
        self._placer = self._placer or make()
        decision = self._placer.tick(in_process_only=True)
        for start in decision.starts if decision else ():
            self._context.log.info(
                "no placement daemon is running: %s placed on %s by the coordinator's rules",
                start.build,
                start.node,
            )

    def close(self) -> None:
        if self._placer is not None:
            self._placer.close()


def _place_alone(
    context: dg.AssetExecutionContext, build: Build, fleet: Fleet, claim: bool = True
) -> Node | None:
    """The node the core decision picks for `build` alone among the free nodes that answer their
    probe, claimed (unless `claim` is False: an in-memory instance shares nothing); None if no
    node can take it now."""
    instance, run = context.instance, context.run
    held = set(claims.claims(instance)) if claim else set()
    free = [n for n in fleet.nodes if n.builder not in held]
    if not free:
        return None
    with ThreadPoolExecutor(max_workers=len(free)) as pool:
        probes = list(pool.map(probe_node, free))
    usable = [n for n, p in zip(free, probes, strict=True) if p.ok]
    if not usable:
        context.log.warning(
            "no free node answered its probe (%s); waiting",
            "; ".join(f"{p.node}: {p.reason}" for p in probes),
        )
        return None
    cost = placement.CostModel(fleet, probes=[p for p in probes if p.ok])
    now = time.time()
    decision = placement.choose_placements([build], {}, usable, cost, now, {build: frozenset()})
    start = decision.starts[0]
    node = fleet.node(start.node)
    if claim:
        if not place(instance, run, node, start, cost.max_jobs(node), now):
            return None
        context.log.info(
            "no placement daemon is running: placed on %s by the coordinator's rules, "
            "builder %s claimed",
            node.name,
            node.builder,
        )
    return node


def _node_for_a_lone_run(
    context: dg.AssetExecutionContext, build: Build, fleet: Fleet, poll_s: float
) -> Node:
    """A run on an in-memory instance: nothing else shares it, so nothing is claimed."""
    while (node := _place_alone(context, build, fleet, claim=False)) is None:
        time.sleep(poll_s)
    return node


@contextmanager
def machine_for_test(
    context: dg.AssetCheckExecutionContext, node: Node, fleet: Fleet, poll_s: float
) -> Iterator[int]:
    """Hold `node`'s builder for a bake this run must make there (a GPU test image); MAX_JOBS.

    The same claim a placed build holds, so a test image never shares a machine with a build:
    the run waits until the builder is free.
    """
    instance, run_id = context.instance, context.run.run_id
    shared = claims.supported(instance)
    if shared:
        ensure_pools(instance, [node.builder])
        while not claims.claim_builder(instance, node.builder, run_id):
            holder = claims.holder(instance, node.builder)
            context.log.info("waiting for builder %s, held by run %s", node.builder, holder)
            time.sleep(poll_s)
    try:
        clear_of_foreign_builds(context, node, fleet)
        with LeaseKeeper(instance, run_id):
            yield placement.max_jobs(node, probe_node(node))
    finally:
        if shared:
            release(instance, run_id)
