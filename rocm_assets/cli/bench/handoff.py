"""`rocm-assets bench handoff`: the farm's own overhead between an input's push and its
dependent's bake, on the example farm run for real (examples/demo.py: a registry, a dockerd per
node, buildx, `dagster dev`, the two-arch backfill), read from BuildKit's history.

A build's handoff is its BuildKit record's start minus the moment it could start: the latest
end among its inputs' records (their bakes pushed), or its node's previous record's end when the
node was still busy then. That wait for a busy node is placement's, and is shown apart. Every
time is on this machine's clock (BuildKit's records and Dagster's events alike).

The handoff splits at Dagster's own records, each clipped to the moment the build could start:

- `recorded`: the input's bake end -> its materialization recorded (the worker reads the
  metadata file and the history ref);
- `placed`: -> the dependent's run dequeued by the daemon (RUN_STARTING: its tick placed it);
- `worker`: -> the run worker's RUN_START (the process spawned, `import dagster`, the code
  location loaded: Dagster records nothing in between, so this part is not split);
- `preflight`: -> the preflight's line (the step started, its inputs asked of the registry);
- `claim`: -> the bake command's line (the builder's claim checked);
- `buildx`: -> BuildKit's record starts (buildx's start-up and bake's evaluation of the file,
  inside buildx: not split).
"""

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocm_assets.cli.common import CliError
from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.build.builds import Build, build_deps, builds_for
from rocm_assets.core.build.invocation import HistoryRecord, HistoryUnavailable, history
from rocm_assets.core.common.constants import BUILD_NAME_PREFIX, ROCM_BUILD_TAG
from rocm_assets.core.common.timefmt import from_rfc3339
from rocm_assets.core.nodes.fleet import load_fleet

PARTS = ("recorded", "placed", "worker", "preflight", "claim", "buildx")
UNSPLIT = {
    "worker": "process spawn, `import dagster` and the code location's load: no record between",
    "buildx": "buildx's start-up and bake's evaluation, inside buildx: no record between",
}
# The goal on the demo farm (issue 36).
TARGET_MEDIAN_S = 5.0
TARGET_MAX_S = 10.0
DEMO = Path(__file__).resolve().parents[3] / "examples" / "demo.py"
_PREFLIGHT_PREFIX = "preflight: "
_BAKE_PREFIX = "baking "


@dataclass(frozen=True)
class Span:
    """One build's BuildKit record: where it ran and when."""

    build: Build
    node: str
    run_id: str
    start_s: float
    end_s: float


@dataclass
class RunMarks:
    """What Dagster recorded of one build's run, as epoch seconds (None: not recorded)."""

    materialized_s: float | None = None
    starting_s: float | None = None
    started_s: float | None = None
    preflight_s: float | None = None
    bake_command_s: float | None = None


@dataclass(frozen=True)
class Handoff:
    build: Build
    node: str
    input: Build
    handoff_s: float
    busy_node_s: float
    parts: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "build": str(self.build),
            "node": self.node,
            "input": str(self.input),
            "handoff_s": round(self.handoff_s, 3),
            "busy_node_s": round(self.busy_node_s, 3),
            "parts_s": {k: round(v, 3) for k, v in self.parts.items()},
        }


def spans_from_history(
    records: Mapping[str, Iterable[HistoryRecord]], builds_by_run: Mapping[str, Build]
) -> dict[Build, Span]:
    """Each build's completed record, from every node's history (node -> records), matched by
    its history name's run id to the run that made it."""
    spans: dict[Build, Span] = {}
    for node, listed in records.items():
        for record in listed:
            parts = record.name.split("/")
            if len(parts) != 4 or parts[0] != BUILD_NAME_PREFIX or record.status != "Completed":
                continue
            build = builds_by_run.get(parts[3])
            start, end = from_rfc3339(record.created_at), from_rfc3339(record.completed_at)
            if build is None or start is None or end is None or parts[1] != build.target:
                continue
            if build.arch is not None and parts[2] != build.arch:
                continue
            spans[build] = Span(build, node, parts[3], start, end)
    return spans


def handoffs(
    graph: BakeGraph, spans: Mapping[Build, Span], marks: Mapping[Build, RunMarks]
) -> list[Handoff]:
    """The handoff of every build with inputs, split into `PARTS` (see the module docstring)."""
    out = []
    for build, span in sorted(spans.items(), key=lambda item: item[1].start_s):
        inputs = [spans[d] for d in build_deps(graph, build) if d in spans]
        if not inputs:
            continue
        last = max(inputs, key=lambda s: s.end_s)
        earlier = [s.end_s for s in spans.values() if s.node == span.node and s is not span]
        free = max((end for end in earlier if end <= span.start_s), default=float("-inf"))
        ready = max(last.end_s, free)
        mine = marks.get(build, RunMarks())
        points = [
            marks.get(last.build, RunMarks()).materialized_s,
            mine.starting_s,
            mine.started_s,
            mine.preflight_s,
            mine.bake_command_s,
            span.start_s,
        ]
        parts: dict[str, float] = {}
        at = ready
        for name, point in zip(PARTS, points, strict=True):
            if point is None:
                continue
            # Clipped to `ready` and to the previous mark: each part is time the build waited.
            point = max(point, at)
            parts[name] = point - at
            at = point
        out.append(
            Handoff(
                build=build,
                node=span.node,
                input=last.build,
                handoff_s=span.start_s - ready,
                busy_node_s=max(0.0, free - last.end_s),
                parts=parts,
            )
        )
    return out


def critical_path_s(graph: BakeGraph, spans: Mapping[Build, Span]) -> float:
    """The longest chain of measured build durations: what the farm would take with no overhead."""
    finish: dict[Build, float] = {}
    for build in sorted(spans, key=lambda b: graph.targets.index(b.target)):
        deps = [finish[d] for d in build_deps(graph, build) if d in finish]
        finish[build] = max(deps, default=0.0) + spans[build].end_s - spans[build].start_s
    return max(finish.values(), default=0.0)


def summary(
    graph: BakeGraph, spans: Mapping[Build, Span], marks: Mapping[Build, RunMarks]
) -> dict[str, Any]:
    rows = handoffs(graph, spans, marks)
    values = [r.handoff_s for r in rows]
    first = min((s.start_s for s in spans.values()), default=0.0)
    last = max((s.end_s for s in spans.values()), default=0.0)
    path = critical_path_s(graph, spans)
    parts = {p: [r.parts[p] for r in rows if p in r.parts] for p in PARTS}
    return {
        "builds": len(spans),
        "handoffs": [r.to_json() for r in rows],
        "median_s": round(statistics.median(values), 3) if values else None,
        "max_s": round(max(values), 3) if values else None,
        "parts_median_s": {p: round(statistics.median(v), 3) for p, v in parts.items() if v},
        "parts_max_s": {p: round(max(v), 3) for p, v in parts.items() if v},
        "busy_node_max_s": round(max((r.busy_node_s for r in rows), default=0.0), 3),
        "bakes_span_s": round(last - first, 3),
        "critical_path_s": round(path, 3),
        "unsplit": dict(UNSPLIT),
        "target_median_s": TARGET_MEDIAN_S,
        "target_max_s": TARGET_MAX_S,
    }


# ---- the real run ----


def build_runs(instance: Any) -> tuple[dict[str, Build], list[str]]:
    """The demo's build runs: run id -> build for each that succeeded, and the builds whose run
    failed. Run records only: cheap enough to poll beside the farm it measures."""
    import dagster as dg

    succeeded: dict[str, Build] = {}
    failed: list[str] = []
    for record in instance.get_run_records():
        run = record.dagster_run
        tag = run.tags.get(ROCM_BUILD_TAG)
        if tag and run.status == dg.DagsterRunStatus.SUCCESS:
            succeeded[run.run_id] = Build.parse(tag)
        elif tag and run.status == dg.DagsterRunStatus.FAILURE:
            failed.append(tag)
    return succeeded, failed


def read_marks(instance: Any, builds_by_run: Mapping[str, Build]) -> dict[Build, RunMarks]:
    """Each build's marks, from its successful run's event log (read once, at the end)."""
    import dagster as dg

    marks: dict[Build, RunMarks] = {}
    for run_id, build in builds_by_run.items():
        found = RunMarks()
        for entry in instance.all_logs(run_id):
            event = entry.dagster_event
            kind = event.event_type if event is not None else None
            if kind == dg.DagsterEventType.RUN_STARTING:
                found.starting_s = entry.timestamp
            elif kind == dg.DagsterEventType.RUN_START:
                found.started_s = entry.timestamp
            elif kind == dg.DagsterEventType.ASSET_MATERIALIZATION:
                found.materialized_s = entry.timestamp
            elif event is None and found.preflight_s is None:
                if entry.user_message.startswith(_PREFLIGHT_PREFIX):
                    found.preflight_s = entry.timestamp
            elif event is None and entry.user_message.startswith(_BAKE_PREFIX):
                found.bake_command_s = found.bake_command_s or entry.timestamp
        marks[build] = found
    return marks


def run_demo(*, hold_s: float, timeout_s: float, progress: Any) -> dict[str, Any]:
    """Run examples/demo.py's farm and backfill to the end; the handoffs from its history."""
    if not DEMO.is_file():
        raise CliError(f"{DEMO} is not here: bench handoff runs the repository's example farm")
    farm = DEMO.parent / "farm"
    graph = load_graph(farm / "bake.hcl", {})
    fleet = load_fleet(farm / "fleet.yaml")
    expected = set(builds_for(graph, graph.select(["default"]), graph.arches))
    state = Path(tempfile.mkdtemp(prefix="rocm-bench-handoff-")) / "demo"
    env = {**os.environ, "HOLD_S": f"{hold_s:g}"}
    argv = [sys.executable, str(DEMO), "--state-dir", str(state), "--port", str(_free_port())]
    demo = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines: list[tuple[float, str]] = []

    def pump() -> None:
        assert demo.stdout is not None
        lines.extend((time.time(), line.rstrip()) for line in demo.stdout)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    home = state / "dagster_home"
    deadline = time.monotonic() + timeout_s
    instance = None
    try:
        while True:
            if demo.poll() is not None:
                tail = " | ".join(line for _, line in lines[-3:])
                raise CliError(f"the demo exited {demo.returncode} before its builds ended: {tail}")
            if time.monotonic() > deadline:
                raise CliError(f"the demo's builds did not end in {timeout_s:.0f} s")
            if instance is None and any("backfill" in t for _, t in lines):
                import dagster as dg

                instance = dg.DagsterInstance.from_config(str(home))
            if instance is not None:
                builds_by_run, failed = build_runs(instance)
                if failed:
                    raise CliError(f"a build of the demo failed: {failed[0]}")
                # A run succeeds only after it recorded its materialization.
                if expected <= set(builds_by_run.values()):
                    break
            time.sleep(2.0)
        marks = read_marks(instance, builds_by_run)
        progress(f"{len(expected)} builds done; reading each node's BuildKit history")
        records = {}
        docker_env = {**os.environ, "DOCKER_CONFIG": str(state / "docker-config")}
        for node in fleet.nodes:
            try:
                records[node.name] = history(node.builder, docker_env)
            except HistoryUnavailable as exc:
                raise CliError(f"node {node.name}: {exc}") from None
    finally:
        if instance is not None:
            instance.dispose()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGTERM)
        try:
            demo.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    spans = spans_from_history(records, builds_by_run)
    missing = sorted(map(str, expected - set(spans)))
    if missing:
        raise CliError(f"no completed BuildKit record for {', '.join(missing)}")
    launched = next((t for t, line in lines if line.startswith("$ rocm-assets backfill")), None)
    doc = summary(graph, spans, marks)
    doc["hold_s"] = hold_s
    if launched is not None:
        doc["first_bake_after_launch_s"] = round(
            min(s.start_s for s in spans.values()) - launched, 3
        )
    return doc


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def text_report(doc: Mapping[str, Any]) -> str:
    """One line per handoff, its parts in order, then the figures against the goals."""
    lines = [
        f"handoff: {doc['builds']} builds of the example farm (HOLD_S={doc['hold_s']:g}), "
        f"bakes spanned {doc['bakes_span_s']:.1f} s against a {doc['critical_path_s']:.1f} s "
        "critical path of their own durations"
    ]
    for row in doc["handoffs"]:
        parts = " + ".join(f"{k} {v:.2f}" for k, v in row["parts_s"].items())
        busy = (
            f" (node busy {row['busy_node_s']:.1f} s before: placement's)"
            if row["busy_node_s"]
            else ""
        )
        lines.append(
            f"  {row['build']:<22} on {row['node']:<10} after {row['input']:<18} "
            f"{row['handoff_s']:6.2f} s = {parts}{busy}"
        )
    lines.append(
        f"median {doc['median_s']:.2f} s (goal < {doc['target_median_s']:g}), max "
        f"{doc['max_s']:.2f} s (goal < {doc['target_max_s']:g})"
    )
    lines.append(
        "median parts: " + ", ".join(f"{k} {v:.2f} s" for k, v in doc["parts_median_s"].items())
    )
    lines.extend(f"not split: {k}: {v}" for k, v in doc["unsplit"].items())
    return "\n".join(lines) + "\n"
