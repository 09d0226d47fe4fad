"""`rocm-assets bench handoff`: the split of each build's handoff, from BuildKit's history and
Dagster's records.

The arithmetic is tested on the example farm's real graph (bake --print, buildx 0.29) with
records written here; the whole bench runs the example farm for real (registry, dockerds,
buildx, `dagster dev`) in the slow test, which checks what it reads, never how fast it is.
"""

import json

import pytest

from rocm_assets.cli.bench.handoff import (
    PARTS,
    RunMarks,
    Span,
    handoffs,
    spans_from_history,
    summary,
)
from rocm_assets.core.bake import load_graph
from rocm_assets.core.build.builds import Build
from rocm_assets.core.build.invocation import HistoryRecord
from rocm_assets.core.common.timefmt import from_rfc3339
from rocm_assets_tests.helpers import PROJECT_ROOT, rocm_assets_cli

FARM = PROJECT_ROOT / "examples" / "farm" / "bake.hcl"


def test_buildkit_times_are_read_to_the_microsecond() -> None:
    assert from_rfc3339("1970-01-01T00:00:01.123456789Z") == pytest.approx(1.123456)
    assert from_rfc3339("1970-01-01T01:00:02+01:00") == 2.0
    assert from_rfc3339("1970-01-01T00:00:03.5Z") == 3.5
    assert from_rfc3339("yesterday") is None and from_rfc3339(None) is None


def test_history_records_are_matched_to_their_runs_by_name() -> None:
    runtime, src = Build("runtime", "gfx942"), Build("src")
    records = {
        "demo-big": [
            HistoryRecord("r1", "rocm-pytorch-build/runtime/gfx942/run1", "Completed",
                          "1970-01-01T00:00:10Z", "1970-01-01T00:00:20Z"),
            # A failed record and someone else's build are not the build's.
            HistoryRecord("r2", "rocm-pytorch-build/runtime/gfx942/run9", "Error",
                          "1970-01-01T00:00:21Z", "1970-01-01T00:00:22Z"),
            HistoryRecord("r3", "other-build", "Completed",
                          "1970-01-01T00:00:21Z", "1970-01-01T00:00:22Z"),
        ],
        "demo-mid": [
            HistoryRecord("r4", "rocm-pytorch-build/src/noarch/run2", "Completed",
                          "1970-01-01T00:00:11Z", "1970-01-01T00:00:19Z"),
        ],
    }  # fmt: skip
    spans = spans_from_history(records, {"run1": runtime, "run2": src, "run9": runtime})
    assert spans == {
        runtime: Span(runtime, "demo-big", "run1", 10.0, 20.0),
        src: Span(src, "demo-mid", "run2", 11.0, 19.0),
    }


def _farm_spans() -> tuple[dict[Build, Span], dict[Build, RunMarks]]:
    """runtime@gfx942 (0-10 s) on big, src (0-12 s) on mid, base@gfx942 after runtime on big,
    torch@gfx942 after base and src on small, which a build outside the graph holds until 40 s."""
    runtime, src = Build("runtime", "gfx942"), Build("src")
    base, torch = Build("base", "gfx942"), Build("torch", "gfx942")
    spans = {
        runtime: Span(runtime, "big", "a", 0.0, 10.0),
        src: Span(src, "mid", "b", 0.0, 12.0),
        base: Span(base, "big", "c", 14.0, 24.0),
        Build("runtime", "gfx1100"): Span(Build("runtime", "gfx1100"), "small", "x", 15.0, 40.0),
        torch: Span(torch, "small", "d", 43.0, 73.0),
    }
    marks = {
        runtime: RunMarks(materialized_s=10.5),
        src: RunMarks(materialized_s=12.4),
        base: RunMarks(
            materialized_s=24.6, starting_s=11.5, started_s=12.5, preflight_s=13.0,
            bake_command_s=13.2,
        ),
        torch: RunMarks(starting_s=41.0, started_s=42.0, preflight_s=42.5, bake_command_s=42.6),
    }  # fmt: skip
    return spans, marks


def test_each_handoff_is_split_at_dagsters_records_and_a_busy_node_is_shown_apart() -> None:
    graph = load_graph(FARM)
    spans, marks = _farm_spans()
    rows = {str(r.build): r for r in handoffs(graph, spans, marks)}
    # Only builds with inputs have a handoff.
    assert set(rows) == {"base@gfx942", "torch@gfx942"}
    base = rows["base@gfx942"]
    assert (base.input, base.node, base.busy_node_s) == (Build("runtime", "gfx942"), "big", 0.0)
    assert base.handoff_s == pytest.approx(4.0)
    assert base.parts == pytest.approx(
        {"recorded": 0.5, "placed": 1.0, "worker": 1.0, "preflight": 0.5, "claim": 0.2,
         "buildx": 0.8}
    )  # fmt: skip
    assert list(base.parts) == list(PARTS)
    # torch's last input (base) was pushed at 24 s, but small was busy until 40 s: 16 s is
    # placement's, and the handoff counts from 40 s. The parts before that are clipped to 0.
    torch = rows["torch@gfx942"]
    assert (torch.input, torch.busy_node_s) == (Build("base", "gfx942"), 16.0)
    assert torch.handoff_s == pytest.approx(3.0)
    assert torch.parts == pytest.approx(
        {"recorded": 0.0, "placed": 1.0, "worker": 1.0, "preflight": 0.5, "claim": 0.1,
         "buildx": 0.4}
    )  # fmt: skip
    for row in rows.values():
        assert sum(row.parts.values()) == pytest.approx(row.handoff_s)


def test_the_summary_gives_median_max_the_critical_path_and_what_is_not_split() -> None:
    graph = load_graph(FARM)
    spans, marks = _farm_spans()
    doc = summary(graph, spans, marks)
    assert (doc["median_s"], doc["max_s"]) == (3.5, 4.0)
    assert doc["busy_node_max_s"] == 16.0
    # runtime 10 -> base 10 -> torch 30; src (12) is shorter than runtime + base.
    assert doc["critical_path_s"] == 50.0
    assert doc["bakes_span_s"] == 73.0
    assert set(doc["unsplit"]) == {"worker", "buildx"}
    assert json.loads(json.dumps(doc)) == doc


@pytest.mark.slow
def test_bench_handoff_runs_the_example_farm_and_splits_every_handoff() -> None:
    # Real: the demo's registry, three dockerds, buildx 0.29, `dagster dev` and its daemon.
    done = rocm_assets_cli("bench", "handoff", "--hold", "3", "--json", timeout_s=1200)
    assert done.returncode in (0, 1), done.stderr
    doc = json.loads(done.stdout)
    graph = load_graph(FARM)
    # Nine builds: runtime, base, torch and torch-wheel for two arches, and src once.
    assert doc["builds"] == 9
    rows = doc["handoffs"]
    assert sorted(r["build"] for r in rows) == sorted(
        f"{t}@{a}" for t in ("base", "torch", "torch-wheel") for a in graph.arches
    )
    for row in rows:
        # Every part was recorded, in order, and they add up to the handoff.
        assert list(row["parts_s"]) == list(PARTS), row
        assert sum(row["parts_s"].values()) == pytest.approx(row["handoff_s"], abs=0.01)
        assert row["handoff_s"] >= 0 and row["busy_node_s"] >= 0
    # The verdict is the goal's: exit 1 exactly when a goal is missed, and it says which.
    missed = doc["median_s"] >= doc["target_median_s"] or doc["max_s"] >= doc["target_max_s"]
    assert done.returncode == int(missed)
    assert ("rocm-assets: bench handoff: " in done.stderr) is missed
