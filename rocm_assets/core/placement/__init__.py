"""Placement of bake builds on the fleet: cost model, list schedulers, lower bounds, online choice.

Pure: no Dagster, no I/O. The fleet and probe objects are read through the Protocols below, so
`rocm_assets.core.nodes.fleet` (pydantic) and test stand-ins both fit.

Time model (scheduling-facts.md §4, §5). A build i placed on node p occupies p for

    o(i, p) = pulls(i, p) + t(i, p) + push(i, p)

and no dependent starts before the push has ended. One build per node at a time: several builds
on one box would each derive MAX_JOBS from MemAvailable as though alone and oversubscribe it.

    J(p)         = max(1, min(cores_p, floor(mem_available_gb_p / 2)))        # MAX_JOBS, 2 GB a job
    t(i, p)      = t_ref(i) * (J_ref / J(p)) ** ALPHA                          # ALPHA = 0.8
                   t_ref is the table's, or the median of the target's measured durations
                   each brought to J_ref by the same law; an exact (target, node, J(p))
                   measurement is used as it is
    push(i, p)   = size_gb(i) * 8000 / link_mbps(p)                            # GB -> Mbit
    pulls(i, p)  = sum over inputs k of i not built on p: size_gb(k) * 8000 / link_mbps(p)

mem_available comes from a live probe when there is one, else the manifest's mem_gb; J_ref is the
same rule on the manifest's reference node. The consumer's link stands in for its downlink.
Inputs outside the request (a dependency that is neither a build of the problem nor placed) are
taken as already published, and are pulled from the registry at the consumer's link: they cost
the same on every node of the same link, so they favour fast links for big inputs.

Strategies (`STRATEGIES`, `plan`): "greedy" is the seed's rule (longest eligible build to the free
node that finishes it soonest); "critical-path" is HEFT (upward-rank priority, earliest-finish
node, no insertion); "peft" is PEFT (optimistic cost table lookahead); "default" runs all three
and keeps the shortest plan, so it is never worse than greedy. `choose_placements` decides once
from scratch; `follow.PlanFollower` is what the run coordinator calls each tick: one plan,
followed, re-planned on drift, improved by CP-SAT from a solver runner (`runners`). Import those
two modules by name: they import the solver, which imports this package. `lower_bounds`,
`best_bound` and `validate_schedule` judge any plan.
"""

from rocm_assets.core.build.builds import Build as Build
from rocm_assets.core.placement.bounds import (
    Bound as Bound,
    LowerBounds as LowerBounds,
    best_bound as best_bound,
    lower_bounds as lower_bounds,
    validate_schedule as validate_schedule,
)
from rocm_assets.core.placement.cost import (
    ALPHA as ALPHA,
    GB_PER_JOB as GB_PER_JOB,
    MBIT_PER_GB as MBIT_PER_GB,
    CostModel as CostModel,
    FleetLike as FleetLike,
    NodeLike as NodeLike,
    PlacementError as PlacementError,
    ProbeLike as ProbeLike,
    max_jobs as max_jobs,
    transfer_s as transfer_s,
)
from rocm_assets.core.placement.farm import (
    FarmState as FarmState,
    FollowSettings as FollowSettings,
    Hold as Hold,
    PlannedBuild as PlannedBuild,
    PlanView as PlanView,
    Running as Running,
    solver_budget_s as solver_budget_s,
)
from rocm_assets.core.placement.heuristics import (
    STRATEGIES as STRATEGIES,
    critical_path as critical_path,
    default as default,
    greedy as greedy,
    peft as peft,
    plan as plan,
)
from rocm_assets.core.placement.online import (
    Decision as Decision,
    Start as Start,
    Waiting as Waiting,
    choose_placements as choose_placements,
)
from rocm_assets.core.placement.problem import (
    Assignment as Assignment,
    Placed as Placed,
    Problem as Problem,
    Schedule as Schedule,
)
