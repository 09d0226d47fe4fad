"""What the instance remembers of finished builds: where each was built, whether it published,
and how long builds took (the cost model's measured durations)."""

from datetime import UTC, datetime
from statistics import median

import dagster as dg

from rocm_assets.core import placement
from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.build.builds import Build
from rocm_assets.core.common.constants import ROCM_BUILD_TAG, ROCM_NODE_TAG
from rocm_assets.core.nodes.fleet import Fleet

# How far back a finished build still tells where it was built (locality) or that it failed.
_FINISHED_WINDOW_S = 86400.0
_FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


def finished_builds(
    instance: dg.DagsterInstance, builds: set[Build], nodes: set[str], now: float
) -> tuple[dict[Build, str], dict[Build, tuple[str, float]]]:
    """From the newest finished run of each build of the last day: where it was built (it
    published), or how it ended when it did not (FAILURE or CANCELED, and when)."""
    if not builds:
        return {}, {}
    records = instance.get_run_records(
        dg.RunsFilter(
            statuses=_FINISHED,
            updated_after=datetime.fromtimestamp(now - _FINISHED_WINDOW_S, UTC),
        ),
        order_by="update_timestamp",
        ascending=True,
    )
    wanted = {str(b): b for b in builds}
    built_on: dict[Build, str] = {}
    failed: dict[Build, tuple[str, float]] = {}
    for record in records:  # oldest first: the newest run of each build wins
        run = record.dagster_run
        build = wanted.get(run.tags.get(ROCM_BUILD_TAG, ""))
        if build is None:
            continue
        if run.status == dg.DagsterRunStatus.SUCCESS:
            failed.pop(build, None)
            if run.tags.get(ROCM_NODE_TAG) in nodes:
                built_on[build] = run.tags[ROCM_NODE_TAG]
        else:
            built_on.pop(build, None)
            ended = record.end_time or record.update_timestamp.timestamp()
            reason = f"its last run {run.run_id[:8]} ended {run.status.value}"
            failed[build] = (reason, ended)
    return built_on, failed


def measured_durations(
    instance: dg.DagsterInstance, graph: BakeGraph, fleet: Fleet
) -> dict[tuple[str, str, int], float]:
    """Median build seconds by (target, node, MAX_JOBS), from recent materializations.

    A cache hit (nothing new pushed: metadata `cache_hit`) says nothing about build time.
    """
    cost = placement.CostModel(fleet)
    names = {n.name for n in fleet.nodes}
    samples: dict[tuple[str, str, int], list[float]] = {}
    for target in graph.asset_targets:
        result = instance.fetch_materializations(dg.AssetKey(target), limit=50)
        for record in result.records:
            meta = record.asset_materialization.metadata if record.asset_materialization else {}
            node, jobs, seconds, hit = (
                getattr(meta.get(k), "value", None)
                for k in ("node", "max_jobs", "duration_s", "cache_hit")
            )
            if hit is True:
                continue
            if isinstance(node, str) and isinstance(jobs, int) and isinstance(seconds, float | int):
                # A bake's wall time includes its push; the model adds the push itself.
                pushed = fleet.node(node) if node in names else None
                own = float(seconds) - (cost.push_s(target, pushed) if pushed else 0.0)
                samples.setdefault((target, node, jobs), []).append(max(own, 1.0))
    return {key: median(values) for key, values in samples.items()}
