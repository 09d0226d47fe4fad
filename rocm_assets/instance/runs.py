"""Runs as the farm reads them: states, and the builds a run makes. Shared by the coordinator,
the placement tick, the build resource and watch."""

import dagster as dg

from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.build.builds import Build, builds_for, op_name, run_partitions

# A build in one of these states is the farm's business: queued, or holding (or about to hold)
# its node. QUEUED runs never count against Dagster's own limits, but they do here.
IN_FLIGHT_STATUSES = (
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
)
# Dequeued and running: the states in which a run's build holds its node.
HOLDING_STATUSES = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)


def builds_of_run(
    instance: dg.DagsterInstance, run: dg.DagsterRun, graph: BakeGraph
) -> list[Build]:
    """The builds `run` makes: its asset selection (or its plan's steps) times its partitions."""
    if run.asset_selection is not None:
        targets = {k.path[0] for k in run.asset_selection if len(k.path) == 1}
    else:
        ops = {op_name(t): t for t in graph.asset_targets}
        snapshot = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
        targets = {ops[s.key] for s in snapshot.steps if s.key in ops} if snapshot else set()
    return builds_for(graph, targets, run_partitions(run.tags, graph.arches))
