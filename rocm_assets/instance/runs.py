"""Run states as the farm reads them, shared by the coordinator, the build resource and watch."""

import dagster as dg

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
