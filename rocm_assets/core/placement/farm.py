"""What the plan follower is told each tick, its settings, and the plan it shows.

`FarmState` is the caller's view of the farm at one instant; `FollowSettings` the follower's
knobs (the coordinator reads them from dagster.yaml under the same names); `PlanView` the plan
being followed, for `rocm-assets watch` and the runs' tags.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from rocm_assets.core.build.builds import Build
from rocm_assets.core.placement.cost import CostModel, NodeLike
from rocm_assets.core.placement.problem import EPS


class Hold(NamedTuple):
    """A node taken by something the plan does not own, until an estimated (absolute) time:
    `what` says by what, in words a waiting run's tag and `watch` show."""

    node: str
    since_s: float
    until_s: float
    what: str


def busy_until(holds: Sequence[Hold]) -> dict[str, float]:
    """Each held node and when its last hold is estimated to end."""
    until: dict[str, float] = {}
    for hold in holds:
        until[hold.node] = max(hold.until_s, until.get(hold.node, hold.until_s))
    return until


def hold_drift(
    busy: Mapping[str, float],
    planned: Mapping[str, float],
    made_s: float,
    now_s: float,
    margin: float,
    nodes: frozenset[str],
) -> str | None:
    """Why the holds no longer match the plan's (`planned`: each held node's end when the plan
    was made at `made_s`), or None: a new hold, one longer than planned by `margin`, or one that
    ended before its estimate (a build not of the farm estimated by a default, a bake that ended
    early), which leaves the plan waiting on a free machine."""
    for node, until in busy.items():
        if until <= now_s + EPS:
            continue
        end = planned.get(node)
        if end is None:
            return f"{node} is held outside the plan"
        if until > end + margin * max(0.0, end - made_s) + EPS:
            return f"{node} is held longer than planned"
    for node, end in planned.items():
        if end > now_s + EPS and busy.get(node, 0.0) <= now_s + EPS and node in nodes:
            return f"{node} is free before its hold's estimated end"
    return None


class Running(NamedTuple):
    """A build in flight: its node, when it started and when it is estimated to end."""

    node: str
    started_s: float
    est_end_s: float


@dataclass(frozen=True)
class FarmState:
    """What the caller knows at `now_s`.

    `pending` maps each waiting build to its deps (which may name builds outside it); a dep in
    none of `pending`, `running` and `unpublished` is published. `built_on` gives the node each
    finished build was built on (a dependent there pulls nothing). `nodes` are the usable nodes
    now. `holds` are nodes taken by something the plan does not own. `unpublished` names deps known not to be published (last run failed or
    was cancelled), with why: a build depending on one waits.
    """

    now_s: float
    pending: Mapping[Build, frozenset[Build]]
    running: Mapping[Build, Running]
    nodes: Sequence[NodeLike]
    cost: CostModel
    built_on: Mapping[Build, str] = field(default_factory=dict)
    holds: Sequence[Hold] = ()
    unpublished: Mapping[Build, str] = field(default_factory=dict)

    @property
    def busy(self) -> dict[str, float]:
        return busy_until(self.holds)

    def hold_on(self, node: str) -> Hold | None:
        """What holds `node` now outside the plan (the hold that ends last), or None."""
        holds = [h for h in self.holds if h.node == node and h.until_s > self.now_s]
        return max(holds, key=lambda h: h.until_s, default=None)

    def ready(self, b: Build) -> bool:
        """Every input of pending build `b` is published."""
        return not any(
            d in self.pending or d in self.running or d in self.unpublished
            for d in self.pending.get(b, ())
        )


class Slot(NamedTuple):
    """Where and when the plan has a build."""

    node: str
    start_s: float
    end_s: float


def knob(default: object, doc: str, choices: Sequence[str] = ()) -> Any:
    """A setting the coordinator takes from dagster.yaml under its field's name: `doc` is its
    description there, `choices` the only values it takes (rocm_assets.instance.settings builds
    the schema from these fields)."""
    return field(default=default, metadata={"doc": doc, "choices": tuple(choices)})


@dataclass(frozen=True)
class FollowSettings:
    """The follower's knobs; those declared with `knob` are dagster.yaml settings too.

    The solver's budget for a re-plan of n builds is min(limit, max(min, per_build * n))
    (`solver_budget_s`). Plans compare by their mean makespan over `robust_samples` draws of
    the spread finished builds showed (`robust`); 0: by makespan alone. Above
    `solver_max_builds` the heuristics' plan stands alone (the CP-SAT model grows with builds x
    nodes), plans compare by makespan alone and no idle node is filled (a check re-times the
    plan once per candidate move).
    """

    replan_drift_margin: float = knob(
        0.25, "Re-plan when a build has run this share past its estimate."
    )
    replan_early_margin: float | None = knob(
        0.1,
        "Re-plan when a build ends this share of its estimate early (its machine is free sooner "
        "than planned); null: never.",
    )
    solver_min_seconds: float = knob(2.0, "The solver's budget for a small re-plan.")
    solver_seconds_per_build: float = knob(
        0.6, "The solver's budget grows by this per build at stake."
    )
    solver_time_limit_seconds: float = knob(
        60.0, "The most the solver gets for one re-plan (a 100-build backfill)."
    )
    solver_max_builds: int = 300
    robust_samples: int = 16
    fill_idle_nodes: bool = knob(
        True,
        "When a machine is free and its next planned build cannot start yet, move a ready build "
        "planned elsewhere onto it if the plan finishes no later.",
    )

    def scaled(self, factor: float) -> "FollowSettings":
        """The same settings with every solver budget figure times `factor` (the bench's)."""
        return replace(
            self,
            solver_min_seconds=self.solver_min_seconds * factor,
            solver_seconds_per_build=self.solver_seconds_per_build * factor,
            solver_time_limit_seconds=self.solver_time_limit_seconds * factor,
        )


def solver_budget_s(builds: int, settings: FollowSettings) -> float:
    """Seconds the solver gets for a re-plan of `builds` builds: a few for a few, about a minute
    for a 100-build backfill with the defaults."""
    return min(
        settings.solver_time_limit_seconds,
        max(settings.solver_min_seconds, settings.solver_seconds_per_build * builds),
    )


@dataclass(frozen=True)
class PlannedBuild:
    build: Build
    node: str
    est_start_s: float
    est_finish_s: float


@dataclass(frozen=True)
class PlanView:
    """The plan being followed: per node, the builds not yet started in order, with estimates.

    `makespan_s` is the expected finish of everything planned or running (absolute);
    `strategy` what produced the plan ("default(peft)", "solver", ...); `reason` why it was
    made; `solver` what the solver is doing or did for it; `duration_sigma` how far finished
    builds strayed from their estimates (a lognormal sigma; above 0, plans compare by their
    mean makespan over draws of it); `proven_bound_s` the lower bound (absolute) CP-SAT proved
    on the finish of this plan generation's builds, as the farm stood when it was made, or None
    when no solve of it has answered.
    """

    strategy: str
    generation: int
    made_s: float
    makespan_s: float
    reason: str
    solver: str
    duration_sigma: float
    queues: Mapping[str, tuple[PlannedBuild, ...]]
    proven_bound_s: float | None = None
