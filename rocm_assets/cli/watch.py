"""`rocm-assets watch`: the farm live, read straight from the Dagster instance ($DAGSTER_HOME, else
./.dagster_home, where `make dev` keeps it).

One line per fleet node: the build it runs (target, arch, run), how long it has run, the time
left by the coordinator's estimate, and a progress bar; then the queue, each waiting build with
what it waits for. Builds are named by their BuildKit history name
`rocm-pytorch-build/<target>/<arch>/<run id>`, the prefix that keeps the sibling project's builds
on the same nodes apart. On a terminal the frame is redrawn in place; otherwise each frame is
printed as plain lines. Ctrl-C (or SIGTERM, SIGHUP) ends it with status 0 within a second,
whatever it is doing: the signal only wakes the main thread (`StopSignals`), while reading,
probing and drawing happen in a thread of their own.

Each node line also says whether the node can be reached: `reachable` (its SSH probe answered),
`UNREACHABLE` with the probe's one-line reason, `probing` (no answer yet), or `not probed (fleet
figures)` for a node with no ssh address, whose fleet figures are all anyone knows of it. The
coordinator's probe results live in the daemon's memory and are not stored, so watch probes for
itself: a background thread probes the fleet every 30 s as the coordinator does, and each frame
reads the latest results (none older than 2 min), so a frame never waits on a node. `--once`
probes once before its frame, bounded by the probe's timeout (about 6 s), since it has no later
frame to show the answer in.

A node whose BuildKit runs a build that is not this farm's (a sibling project's, another farm's,
a bake by hand) shows it as `held by <name> (not this farm's)`, or `held by unnamed build
(<buildx's name for it>)`, with its age and estimated end, as the daemon last read the nodes'
histories (it stores them beside the plan).
"""

import argparse
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from rocm_assets.cli.common import EXIT_ERROR, EXIT_OK
from rocm_assets.cli.farm_instance import farm_home, open_instance
from rocm_assets.core.build.builds import Build
from rocm_assets.core.build.invocation import build_name
from rocm_assets.core.common.constants import (
    FANOUT_PARENT,
    PARTITION_TAG,
    PLACEMENT_WAITING,
    ROCM_BUILD_TAG,
    ROCM_EST_FINISH_TAG,
    ROCM_EST_START_TAG,
    ROCM_FANOUT_TAG,
    ROCM_NODE_TAG,
    ROCM_PLACEMENT_TAG,
    ROCM_WAITING_FOR_TAG,
)
from rocm_assets.core.common.signals import StopSignals
from rocm_assets.core.common.text import bounded, one_line
from rocm_assets.core.common.timefmt import duration, from_iso
from rocm_assets.core.nodes.fleet import Fleet, Node, load_fleet
from rocm_assets.core.nodes.foreign import ForeignBuild
from rocm_assets.core.nodes.probes import NodeProbe, ProbeCache, probe_fleet
from rocm_assets.instance.runs import IN_FLIGHT_STATUSES
from rocm_assets.instance.stored_plan import (
    FOREIGN_KEY,
    PLAN_KEY,
    PlanUnreadable,
    read_foreign,
    read_plan,
)

BAR_WIDTH = 20
PROBE_INTERVAL_S = 30.0
PROBE_MAX_AGE_S = 120.0
NOT_PROBED = "not probed (fleet figures)"
# How many of each node's planned builds a frame lists.
PLAN_SHOWN = 4
# Home, then clear to the end of the screen: the new frame overwrites the old without flicker.
_REDRAW = "\x1b[H\x1b[J"
# The main thread looks at the frames' thread this often while it waits for a signal, and gives
# it this long to finish once one came.
_WAIT_S = 1.0
_JOIN_S = 0.5


def bar(fraction: float | None, width: int = BAR_WIDTH) -> str:
    """`[#####...............]  25%`; `?` when there is no estimate."""
    if fraction is None:
        return f"[{'?' * width}]    ?"
    done = min(max(fraction, 0.0), 1.0)
    filled = round(done * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {round(done * 100):3d}%"


@dataclass(frozen=True)
class BuildRun:
    """One build run as watch shows it."""

    run_id: str
    target: str
    arch: str | None
    node: str | None
    waiting: bool
    created_s: float
    started_s: float | None
    expected_end_s: float | None
    waiting_for: str

    @property
    def history_name(self) -> str:
        return build_name(self.target, self.arch, self.run_id)

    @classmethod
    def from_record(cls, record: dg.RunRecord) -> "BuildRun | None":
        """None for runs that build nothing: asset checks, sensors' runs, fan-out requests."""
        run = record.dagster_run
        tags = run.tags
        if tags.get(ROCM_FANOUT_TAG) == FANOUT_PARENT:
            return None
        if tags.get(ROCM_BUILD_TAG):
            build = Build.parse(tags[ROCM_BUILD_TAG])
            target, arch = build.target, build.arch
        elif tags.get(ROCM_NODE_TAG) and run.asset_selection:
            # `dagster asset materialize` places itself and tags only its node.
            target = ",".join(sorted(k.to_user_string() for k in run.asset_selection))
            arch = tags.get(PARTITION_TAG)
        else:
            return None
        est_start = from_iso(tags.get(ROCM_EST_START_TAG))
        est_finish = from_iso(tags.get(ROCM_EST_FINISH_TAG))
        started = record.start_time
        expected_end = est_finish
        if est_finish is not None and est_start is not None and started is not None:
            # The estimate was made at placement; the run started a little later.
            expected_end = est_finish + (started - est_start)
        return cls(
            run_id=run.run_id,
            target=target,
            arch=arch,
            node=tags.get(ROCM_NODE_TAG) or None,
            waiting=tags.get(ROCM_PLACEMENT_TAG) == PLACEMENT_WAITING,
            created_s=record.create_timestamp.timestamp(),
            started_s=started,
            expected_end_s=expected_end,
            waiting_for=tags.get(ROCM_WAITING_FOR_TAG, ""),
        )

    def progress(self, now: float) -> tuple[str, str, str]:
        """(elapsed, remaining, bar) at `now`."""
        if self.started_s is None:
            left = (
                f"~{duration(self.expected_end_s - now)} left"
                if self.expected_end_s is not None and self.expected_end_s > now
                else "?"
            )
            return "starting", left, bar(0.0 if self.expected_end_s else None)
        elapsed = now - self.started_s
        if self.expected_end_s is None:
            return duration(elapsed), "?", bar(None)
        remaining = self.expected_end_s - now
        total = self.expected_end_s - self.started_s
        left = f"~{duration(remaining)} left" if remaining >= 0 else f"{duration(-remaining)} over"
        return duration(elapsed), left, bar(elapsed / total if total > 0 else 1.0)


def build_runs(records: Iterable[dg.RunRecord]) -> list[BuildRun]:
    found = (BuildRun.from_record(r) for r in records)
    return sorted((b for b in found if b is not None), key=lambda b: (b.created_s, b.run_id))


def node_state(node: Node | None, probe: NodeProbe | None) -> tuple[str, str | None]:
    """What is known of a node's reachability: a label, and the reason when it is unreachable."""
    if node is None:
        return "not in the fleet file", None
    if node.ssh is None:
        return NOT_PROBED, None
    if probe is None:
        return "probing", None
    return ("reachable", None) if probe.ok else ("UNREACHABLE", probe.reason)


def plan_lines(plan: Mapping[str, Any], now: float, shown: int = PLAN_SHOWN) -> list[str]:
    """The coordinator's followed plan: when it expects to finish, and each node's queue."""
    finish = float(plan.get("expected_finish", now))
    when = datetime.fromtimestamp(finish, UTC).strftime("%H:%M UTC")
    lines = [
        f"plan ({plan.get('strategy', '?')}, solver {plan.get('solver', '?')}): expected finish "
        f"{when}, in {duration(finish - now)}"
    ]
    queues: Mapping[str, list[list[Any]]] = plan.get("queues", {})
    node_w = max((len(n) for n in queues), default=4)
    for node, planned in queues.items():
        items = [f"{build} +{duration(float(start) - now)}" for build, start, _ in planned[:shown]]
        more = f", +{len(planned) - shown} more" if len(planned) > shown else ""
        lines.append(f"  {node:<{node_w}}  {', '.join(items)}{more}")
    return lines


def render(
    records: Sequence[dg.RunRecord],
    nodes: Sequence[Node],
    now: float,
    url: str,
    probes: Mapping[str, NodeProbe] | None = None,
    plan: Mapping[str, Any] | None = None,
    plan_unreadable: str | None = None,
    foreign: Sequence[ForeignBuild] = (),
) -> list[str]:
    """One frame: a header, a line per node (with its reachability and any build not of this
    farm holding it), the plan (or why it cannot be read), then the queue."""
    builds = build_runs(records)
    holding = [b for b in builds if b.node and not b.waiting]
    queued = [b for b in builds if b.waiting]
    others = len(records) - len(builds)
    fleet = {n.name: n for n in nodes}
    by_node: dict[str, list[BuildRun]] = {n.name: [] for n in nodes}
    for b in holding:
        by_node.setdefault(str(b.node), []).append(b)
    others_on: dict[str, list[ForeignBuild]] = {}
    for f in foreign:
        others_on.setdefault(f.node, []).append(f)
        by_node.setdefault(f.node, [])
    states = {n: node_state(fleet.get(n), (probes or {}).get(n)) for n in by_node}
    busy = sum(1 for n, runs in by_node.items() if runs or n in others_on)
    down = sum(1 for label, _ in states.values() if label == "UNREACHABLE")
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = [
        f"rocm-assets watch  {stamp}  nodes busy {busy}/{len(by_node)}"
        + (f"  unreachable {down}" if down else "")
        + f"  queued {len(queued)}  other runs {others}  {url.rstrip('/')}/runs"
    ]
    node_w = max((len(n) for n in by_node), default=4)
    state_w = max((len(label) for label, _ in states.values()), default=0)
    target_w = max((len(b.target) for b in holding), default=6)
    arch_w = max((len(b.arch or "noarch") for b in holding), default=6)
    for node, runs in by_node.items():
        label, reason = states[node]
        lead = f"  {node:<{node_w}}  {label:<{state_w}}"
        lines.extend(
            f"{lead}  held by {f.label} (not this farm's), running "
            f"{duration(now - f.started_s)}, est. end in {duration(f.est_end_s - now)} "
            f"(by {f.estimated_by})"
            for f in others_on.get(node, ())
        )
        if not runs and node not in others_on:
            lines.append(f"{lead}  idle" + (f"  ({reason})" if reason else ""))
        for b in runs:
            # A second build on one node breaks the farm's rule: show it, never hide it.
            elapsed, left, shown_bar = b.progress(now)
            lines.append(
                f"{lead}  {b.target:<{target_w}}  {b.arch or 'noarch':<{arch_w}}  "
                f"{b.run_id[:8]}  {elapsed:>8}  {left:>13}  {shown_bar}  {b.history_name}"
            )
        if runs and reason:
            lines.append(f"  {'':<{node_w}}  {'':<{state_w}}  ({reason})")
    if plan and queued:
        lines.extend(plan_lines(plan, now))
    if plan_unreadable:
        lines.append(
            f"plan: unreadable ({plan_unreadable}); the daemon stores a new one when it next plans"
        )
    lines.append(f"queue ({len(queued)} waiting)" + (":" if queued else ""))
    names = [f"{b.target}@{b.arch}" if b.arch else b.target for b in queued]
    reasons = [b.waiting_for or "waiting for placement" for b in queued]
    name_w = max(map(len, names), default=0)
    reason_w = max(map(len, reasons), default=0)
    for b, name, reason in zip(queued, names, reasons, strict=True):
        lines.append(
            f"  {name:<{name_w}}  {b.run_id[:8]}  queued {duration(now - b.created_s):>6}  "
            f"{reason:<{reason_w}}  {b.history_name}"
        )
    return lines


def frame(
    instance: dg.DagsterInstance,
    fleet: Fleet,
    now: float,
    url: str,
    probes: Mapping[str, NodeProbe] | None = None,
) -> list[str]:
    records = instance.get_run_records(dg.RunsFilter(statuses=list(IN_FLIGHT_STATUSES)))
    values = instance.run_storage.get_cursor_values({PLAN_KEY, FOREIGN_KEY})
    stored = values.get(PLAN_KEY)
    plan, unreadable = None, None
    if stored:
        try:
            plan = read_plan(stored)
        except PlanUnreadable as exc:
            # Overwritten, or from another version: said, and the nodes and queue still show.
            unreadable = str(exc)
    foreign = read_foreign(values.get(FOREIGN_KEY))
    return render(records, fleet.nodes, now, url, probes, plan, unreadable, foreign)


def _fit(lines: Sequence[str], width: int) -> str:
    # A wrapped line would push the frame down and break the in-place redraw.
    return "".join(line[:width] + "\n" for line in lines)


def _write_all(text: str) -> None:
    """The whole frame to stdout, unbuffered: a writer blocked on a stalled terminal holds no
    lock the interpreter's exit would need."""
    data = text.encode(sys.stdout.encoding or "utf-8", errors="replace")
    fd = sys.stdout.fileno()
    while data:
        data = data[os.write(fd, data) :]


class _Frames(threading.Thread):
    """Reads the instance, probes and draws, frame after frame, until told to stop; what it
    raised is kept for the main thread."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        fleet: Fleet,
        *,
        url: str,
        interval_s: float,
        once: bool,
        wake: Callable[[], None],
    ) -> None:
        super().__init__(name="rocm-watch-frames", daemon=True)
        self._instance, self._fleet, self._url = instance, fleet, url
        self._interval_s, self._once, self._wake = interval_s, once, wake
        self.stopping = threading.Event()
        self.finished = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._frames()
        except BaseException as exc:  # handed to the main thread, which raises it
            self.error = exc
        finally:
            self.finished.set()
            self._wake()

    def _frame(self, probes: Mapping[str, NodeProbe]) -> list[str]:
        now = time.time()
        try:
            return frame(self._instance, self._fleet, now, self._url, probes)
        except Exception as exc:
            # The instance busy (SQLite locked by a writer past its 5 s timeout) or gone for a
            # moment: said in place of the frame, and the next one tries again.
            stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            reason = bounded(f"{type(exc).__name__}: {one_line(str(exc))}", 300)
            return [f"rocm-assets watch  {stamp}  cannot read the Dagster instance: {reason}"]

    def _frames(self) -> None:
        fleet, once = self._fleet, self._once
        tty = os.isatty(sys.stdout.fileno()) and not once
        probed = any(n.ssh for n in fleet.nodes)
        cache = ProbeCache(PROBE_INTERVAL_S, PROBE_MAX_AGE_S)
        if probed and not once:
            cache.watch(fleet)
        try:
            while not self.stopping.is_set():
                if once:
                    probes = {p.node: p for p in probe_fleet(fleet)} if probed else {}
                else:
                    probes = cache.fresh(time.time())
                lines = self._frame(probes)
                if self.stopping.is_set():
                    return
                if tty:
                    _write_all(_REDRAW + _fit(lines, shutil.get_terminal_size().columns))
                else:
                    _write_all("\n".join(lines) + "\n" + ("" if once else "\n"))
                if once:
                    return
                self.stopping.wait(self._interval_s)
        finally:
            cache.stop()


def follow(
    instance: dg.DagsterInstance,
    fleet: Fleet,
    stop: StopSignals,
    *,
    url: str,
    interval_s: float,
    once: bool,
) -> None:
    """Frames until `stop` receives a signal (or after one with `once`). The main thread only
    waits: whatever the frames' thread is doing (a read, a probe, a write to a stalled
    terminal), a signal ends this within a second."""
    frames = _Frames(instance, fleet, url=url, interval_s=interval_s, once=once, wake=stop.wake)
    frames.start()
    while not frames.finished.is_set():
        if stop.wait(_WAIT_S):
            break
    frames.stopping.set()
    # A read or probe under way is left to the exit: the thread is a daemon's.
    frames.join(_JOIN_S)
    if frames.finished.is_set() and frames.error is not None:
        raise frames.error


def cmd_watch(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        sys.stderr.write("rocm-assets: error: --interval must be a positive number of seconds\n")
        return EXIT_ERROR
    home = farm_home()
    try:
        with StopSignals() as stop:
            fleet = load_fleet(args.fleet)
            with open_instance(home) as instance:
                if stop.received is None:
                    follow(
                        instance,
                        fleet,
                        stop,
                        url=args.url,
                        interval_s=args.interval,
                        once=args.once,
                    )
    except BrokenPipeError:
        # The reader went away (`watch | head`): stop quietly, and keep Python's exit flush
        # from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK
