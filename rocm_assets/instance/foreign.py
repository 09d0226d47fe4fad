"""What each builder is building that is not this farm's, as its BuildKit history shows it.

The fleet is shared: a sibling project, a second rocm-assets farm and bakes run by hand build on
the same nodes. `ForeignWatch` reads every builder's `docker buildx history ls` in threads of
its own, each builder again `every_s` after its last read was asked for, so the daemon's tick
never waits on a builder: the tick takes the last answer (`builds`). A running record that is not
one of this instance's runs (`rocm_assets.core.nodes.foreign`) holds its node.

A builder whose history cannot be read (buildx older than 0.20, a builder that does not answer)
is said once in the daemon's log, and is placed on as before: only this farm's runs hold it.
"""

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import dagster as dg

from rocm_assets.core.build.invocation import HistoryRecord, HistoryUnavailable, history
from rocm_assets.core.common.text import bounded
from rocm_assets.core.nodes.fleet import Fleet, Node
from rocm_assets.core.nodes.foreign import RUNNING, ForeignBuild, foreign_builds, our_run_id
from rocm_assets.core.placement.cost import CostModel

logger = logging.getLogger("rocm_assets.instance")

# A read that takes longer is given up (the drain's bound): its builder keeps its last answer.
READ_TIMEOUT_S = 20.0
_READERS = 4
# The most the first tick of a request waits for reads of builders it has not looked at lately.
SETTLE_S = 5.0
# Run ids remembered as this instance's or not; a farm's runs are never deleted mid-build.
_KNOWN_IDS_MAX = 20_000


@dataclass
class _Builder:
    """One builder's reads: the one in flight, and the last answer."""

    pending: "Future[list[HistoryRecord]] | None" = None
    asked_s: float = 0.0
    records: list[HistoryRecord] = field(default_factory=list)
    # When the last read ended, answered or not; None before the first.
    ended_s: float | None = None
    unreadable: str | None = None


class ForeignWatch:
    """Each builder's running builds that are not this farm's (module docstring)."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        every_s: float,
        default_s: float,
    ) -> None:
        self._instance = instance
        self.every_s = every_s
        self.default_s = default_s
        self._builders: dict[str, _Builder] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._ours: set[str] = set()
        self._not_ours: set[str] = set()
        # ref -> when first seen: a new foreign build is logged once, with how late.
        self._seen: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        return self.every_s > 0

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def refresh(self, fleet: Fleet, now: float) -> None:
        """Take the reads that answered; ask again where the last ask is `every_s` old."""
        if not self.enabled:
            return
        names = {n.builder for n in fleet.nodes}
        for gone in self._builders.keys() - names:
            del self._builders[gone]
        for builder in sorted(names):
            state = self._builders.setdefault(builder, _Builder())
            if state.pending is not None and state.pending.done():
                self._take(builder, state, state.pending, now)
            if state.pending is None and now - state.asked_s >= self.every_s:
                state.asked_s = now
                state.pending = self._readers().submit(self._read, builder)

    def settle(self, fleet: Fleet, bound_s: float = SETTLE_S) -> None:
        """Wait, `bound_s` at most, for the reads of builders last read over two cadences ago
        (or never): the daemon ticks only while runs are queued, so the first tick of a request
        would otherwise place on what it has not looked at."""
        if not self.enabled:
            return
        deadline = time.time() + bound_s
        stale_s = 2 * self.every_s + 1.0
        for node in fleet.nodes:
            state = self._builders.get(node.builder)
            if state is None or state.pending is None:
                continue
            if state.ended_s is not None and time.time() - state.ended_s <= stale_s:
                continue
            with contextlib.suppress(Exception):  # `_take` records why
                state.pending.result(timeout=max(0.0, deadline - time.time()))
            if state.pending.done():
                self._take(node.builder, state, state.pending, time.time())

    def read_now(self, fleet: Fleet) -> None:
        """Read every builder's history and wait for the answers (a tick with no daemon)."""
        if not self.enabled:
            return
        now = time.time()
        futures = {n.builder: self._readers().submit(self._read, n.builder) for n in fleet.nodes}
        for builder, future in futures.items():
            state = self._builders.setdefault(builder, _Builder())
            state.asked_s, state.pending = now, future
            with contextlib.suppress(Exception):  # `_take` records why
                future.result(timeout=READ_TIMEOUT_S + 5.0)
            self._take(builder, state, future, time.time())

    def read_node(self, node: Node, fleet: Fleet, cost: CostModel) -> list[ForeignBuild]:
        """`node`'s foreign builds, read now (a worker's look just before its bake);
        HistoryUnavailable if its history cannot be read."""
        running = [r for r in self._read(node.builder) if r.status == RUNNING]
        self._learn_ids(our_run_id(r.name) for r in running)
        return foreign_builds(
            node, running, self._ours.__contains__, cost, fleet, time.time(), self.default_s
        )

    def unreadable(self) -> dict[str, str]:
        """Builders whose history cannot be read now, and why."""
        return {b: s.unreadable for b, s in self._builders.items() if s.unreadable}

    def builds(self, fleet: Fleet, cost: CostModel, now: float) -> list[ForeignBuild]:
        """The foreign builds running on the fleet's nodes, by the last answered reads."""
        found: list[ForeignBuild] = []
        for node in fleet.nodes:
            state = self._builders.get(node.builder)
            if state is None or state.unreadable or not state.records:
                continue
            running = [r for r in state.records if r.status == RUNNING]
            if not running:
                continue
            self._learn_ids(our_run_id(r.name) for r in running)
            found.extend(
                foreign_builds(
                    node, running, self._ours.__contains__, cost, fleet, now, self.default_s
                )
            )
        for build in found:
            if build.ref not in self._seen:
                self._seen[build.ref] = now
                logger.info(
                    "placement: %s; the node is held until it ends (seen %.1f s after its start)",
                    build.what(now),
                    max(0.0, now - build.started_s),
                )
        live = {b.ref for b in found}
        self._seen = {ref: t for ref, t in self._seen.items() if ref in live}
        return found

    # ---- reading ----
    def _readers(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_READERS, thread_name_prefix="rocm-foreign")
        return self._pool

    def _read(self, builder: str) -> list[HistoryRecord]:
        # The daemon's environment reaches the builders, as the run workers' does.
        return history(builder, dict(os.environ), timeout_s=READ_TIMEOUT_S)

    def _take(
        self, builder: str, state: _Builder, future: "Future[list[HistoryRecord]]", now: float
    ) -> None:
        state.pending, state.ended_s = None, now
        try:
            records = future.result(timeout=0)
        except HistoryUnavailable as exc:
            self._cannot_read(builder, state, str(exc))
            return
        except Exception as exc:
            self._cannot_read(builder, state, f"{type(exc).__name__}: {exc}")
            return
        if state.unreadable:
            logger.info("placement: builder %s's BuildKit history can be read again", builder)
        state.records, state.unreadable = records, None

    def _cannot_read(self, builder: str, state: _Builder, why: str) -> None:
        why = bounded(why, 300)
        if state.unreadable != why:
            logger.warning(
                "placement: cannot read builder %s's BuildKit history, so builds there that are "
                "not this farm's are not seen; it is placed on as before: %s",
                builder,
                why,
            )
        state.records, state.unreadable = [], why

    def _learn_ids(self, run_ids: Iterable[str | None]) -> None:
        """Sort the named run ids not yet known into this instance's and not."""
        new = {i for i in run_ids if i and i not in self._ours and i not in self._not_ours}
        if not new:
            return
        if len(self._ours) + len(self._not_ours) > _KNOWN_IDS_MAX:
            self._ours.clear()
            self._not_ours.clear()
        found = {
            r.dagster_run.run_id
            for r in self._instance.get_run_records(dg.RunsFilter(run_ids=sorted(new)))
        }
        self._ours |= found
        self._not_ours |= new - found


def unreadable_note(unreadable: Mapping[str, str]) -> str:
    """One line for a waiting run: which builders' foreign builds are not seen, and why."""
    return "; ".join(
        f"builds on builder {b} that are not this farm's are not seen (its BuildKit history "
        f"cannot be read: {why})"
        for b, why in sorted(unreadable.items())
    )
