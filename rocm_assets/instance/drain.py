"""Builders held by runs that have ended: freed once BuildKit shows the run's bake has ended.

A build run frees its builder itself when its bake ends. A run that ended still holding one lost
its worker mid-build (kill -9, the OOM killer): the bake's guard (rocm_assets.core.build.guard)
cancels the bake, and until BuildKit has ended it the machine is not free. So the daemon frees
such a builder only once `docker buildx history ls` on it shows no Running record of the run
(every record of a run is named `rocm-pytorch-build/<target>/<arch>/<run id>`), or once
`wait_s` has passed since the run ended, saying what it last saw. The history is read in threads
of the drain's own: the daemon's tick never waits on a builder. While the drain holds a claim,
Dagster's own sweep (run monitoring's `free_slots_after_run_end_seconds`) must not free it under
a live bake, so the drain takes it out of that sweep (`authority.keep_for_bake`).

A run whose worker never started (no RUN_START event) baked nothing: its builder is freed at
once. A failed one gets a line in its run log, and a `rocm/failure` tag the UI's run list shows,
saying that its worker died, with the pid and how: Dagster's own event ("... out of memory") is
written by the code server the worker belonged to, half a second after the death, before any
daemon can know.
"""

import logging
import os
import re
import signal
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import dagster as dg

from rocm_assets.core.build.builds import Build
from rocm_assets.core.build.invocation import HistoryRecord, HistoryUnavailable, history
from rocm_assets.core.common.constants import (
    BUILD_NAME_PREFIX,
    NOARCH,
    ROCM_BUILD_TAG,
    ROCM_FAILURE_TAG,
    ROCM_NODE_TAG,
)
from rocm_assets.core.common.text import bounded
from rocm_assets.core.common.timefmt import duration
from rocm_assets.instance import authority, claims

logger = logging.getLogger("rocm_assets.instance")

# A history read that takes longer is given up, and tried again on a later tick.
_HISTORY_TIMEOUT_S = 20.0
_READERS = 4
# How Dagster words a lost run worker: the code server's `get_run_crash_explanation`.
_SIGNALLED = re.compile(r"terminated by signal (\d+)")
_EXITED = re.compile(r"exited with code (-?\d+)")
_RUN_ENDS = {
    dg.DagsterEventType.RUN_SUCCESS,
    dg.DagsterEventType.RUN_FAILURE,
    dg.DagsterEventType.RUN_CANCELED,
}


@dataclass
class _Ending:
    """A builder whose run ended while holding it."""

    run_id: str
    ended_s: float
    check: "Future[list[HistoryRecord]] | None" = None
    # What the last answered read showed: a running record of the run, or why none was read.
    seen: str = "its history has not been read yet"


def _of_run(record: HistoryRecord, run_id: str) -> bool:
    return record.name.startswith(f"{BUILD_NAME_PREFIX}/") and record.name.endswith(f"/{run_id}")


def _signal_name(number: int) -> str:
    try:
        return f" ({signal.Signals(number).name})"
    except ValueError:
        return ""


class BakeDrain:
    """The daemon's sweep of builders held by ended runs (module docstring)."""

    def __init__(self, instance: dg.DagsterInstance, wait_s: float) -> None:
        self._instance = instance
        self.wait_s = wait_s
        self._ending: dict[str, _Ending] = {}
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def draining(self) -> dict[str, tuple[str, float]]:
        """Builders still held by an ended run: builder -> (run id, when it ended)."""
        return {b: (ending.run_id, ending.ended_s) for b, ending in self._ending.items()}

    def sweep(self, now: float) -> None:
        """Free what ended runs hold once their bakes have ended; start reading the rest."""
        held = claims.claims(self._instance)
        self._ending = {b: e for b, e in self._ending.items() if held.get(b) == e.run_id}
        if not held:
            return
        records = self._instance.get_run_records(dg.RunsFilter(run_ids=sorted(set(held.values()))))
        by_id = {r.dagster_run.run_id: r for r in records}
        for builder, run_id in sorted(held.items()):
            record = by_id.get(run_id)
            if record is not None and record.dagster_run.status not in claims.FINISHED_STATUSES:
                continue
            ending = self._ending.get(builder)
            if ending is None:
                # A missing run was deleted (a run claims only after it is stored); a worker
                # that never started baked nothing, and one that ended its run itself stopped
                # its bake first (run_bake).
                start = self._worker_start(run_id) if record is not None else None
                if record is None or start is None or self._ended_by(run_id, start.pid):
                    self._free(builder, run_id, "its run has ended")
                    continue
                ending = self._ending[builder] = self._begin(builder, record, now)
            self._advance(builder, ending, now)

    def _begin(self, builder: str, record: dg.RunRecord, now: float) -> _Ending:
        run = record.dagster_run
        authority.keep_for_bake(self._instance, run.run_id)
        if run.status == dg.DagsterRunStatus.FAILURE:
            line = self.death_line(run, builder)
            logger.warning("run %s: %s", run.run_id, line)
            self._instance.add_run_tags(run.run_id, {ROCM_FAILURE_TAG: line})
            self._instance.report_engine_event(
                f"{line}; builder {builder} stays claimed until BuildKit shows the bake ended",
                run,
            )
        return _Ending(run.run_id, record.end_time or now)

    def _advance(self, builder: str, ending: _Ending, now: float) -> None:
        check = ending.check
        if check is not None and check.done():
            ending.check = None
            try:
                records = check.result()
            except HistoryUnavailable as exc:
                ending.seen = str(exc)
            except Exception as exc:
                # Not a reason to free the builder sooner, nor to stop the daemon's tick.
                ending.seen = bounded(f"reading its history failed: {type(exc).__name__}: {exc}")
            else:
                running = [
                    r for r in records if r.status == "Running" and _of_run(r, ending.run_id)
                ]
                if not running:
                    self._free(
                        builder,
                        ending.run_id,
                        f"BuildKit on {builder} shows no running build of it, "
                        f"{duration(now - ending.ended_s)} after the run ended",
                    )
                    return
                ending.seen = f"BuildKit still shows {running[0].name} running"
        if now - ending.ended_s >= self.wait_s:
            self._free(
                builder,
                ending.run_id,
                f"{duration(self.wait_s)} after the run ended, though {ending.seen}",
                warn=True,
            )
            return
        if ending.check is None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_READERS, thread_name_prefix="rocm-drain")
            # The daemon's environment reaches the builders, as the run workers' does.
            ending.check = self._pool.submit(
                history, builder, dict(os.environ), timeout_s=_HISTORY_TIMEOUT_S
            )

    def _free(self, builder: str, run_id: str, why: str, warn: bool = False) -> None:
        self._ending.pop(builder, None)
        if not authority.free_builder(self._instance, builder, run_id):
            return  # freed meanwhile, by the run or by hand
        message = f"builder {builder} freed: {why}"
        logger.log(logging.WARNING if warn else logging.INFO, "run %s: %s", run_id, message)
        run = self._instance.get_run_by_id(run_id)
        if run is not None and (warn or run.tags.get(ROCM_FAILURE_TAG)):
            self._instance.report_engine_event(message, run)

    def _worker_start(self, run_id: str) -> dg.DagsterEvent | None:
        """The RUN_START its worker reported (it carries the worker's pid); None if it never
        started."""
        found = self._instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.RUN_START, limit=1
        ).records
        return found[0].event_log_entry.dagster_event if found else None

    def _ended_by(self, run_id: str, pid: int | None) -> bool:
        """The run's end was reported by the process `pid` (its worker), not from outside."""
        found = self._instance.get_records_for_run(
            run_id, of_type=_RUN_ENDS, ascending=False, limit=1
        ).records
        event = found[0].event_log_entry.dagster_event if found else None
        return pid is not None and event is not None and event.pid == pid

    def death_line(self, run: dg.DagsterRun, builder: str) -> str:
        """`run worker (pid N) died mid-bake of <target> <arch> on <node>: <how>`, one line."""
        start = self._worker_start(run.run_id)
        pid = start.pid if start is not None and start.pid is not None else "?"
        text = run.tags.get(ROCM_BUILD_TAG)
        build = Build.parse(text) if text else None
        what = f" of {build.target} {build.arch or NOARCH}" if build else ""
        node = run.tags.get(ROCM_NODE_TAG) or f"builder {builder}"
        return bounded(
            f"run worker (pid {pid}) died mid-bake{what} on {node}: {self._how(run.run_id)}", 500
        )

    def _how(self, run_id: str) -> str:
        """How the worker ended, as Dagster saw it; what the run's failure says otherwise."""
        failure = ""
        for kind in (dg.DagsterEventType.ENGINE_EVENT, dg.DagsterEventType.RUN_FAILURE):
            found = self._instance.get_records_for_run(
                run_id, of_type=kind, ascending=False, limit=20
            ).records
            for found_record in found:
                message = found_record.event_log_entry.message or ""
                if (m := _SIGNALLED.search(message)) is not None:
                    number = int(m.group(1))
                    return f"killed by signal {number}{_signal_name(number)}"
                if (m := _EXITED.search(message)) is not None:
                    return f"it exited with code {m.group(1)}"
                if kind == dg.DagsterEventType.RUN_FAILURE and not failure:
                    failure = message
        return f"the run failed: {failure}" if failure else "the run failed"
