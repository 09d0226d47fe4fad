"""The run coordinator's placement as a policy of the simulator (`simulate.simulate`).

Its own module: the follower's solver runners use the simulator, so the simulator cannot import
the follower.
"""

from rocm_assets.core.build.builds import Build
from rocm_assets.core.placement.farm import FarmState, FollowSettings, Running
from rocm_assets.core.placement.follow import PlanFollower
from rocm_assets.core.placement.problem import Problem
from rocm_assets.core.placement.runners import SolverRunner


class SimulatedCoordinator:
    """The run coordinator's placement as a policy of `simulate.simulate`: a PlanFollower ticked
    at every event with the state the coordinator passes it (pending builds and their deps,
    running builds with estimated ends, the node each finished build is on). Use as
    `simulate(problem, c, label, wake=c.wake)`, so drift is seen when it happens, as the
    daemon's frequent ticks see it."""

    def __init__(
        self,
        problem: Problem,
        runner: SolverRunner | None,
        settings: FollowSettings | None = None,
    ) -> None:
        self.problem = problem
        self.follower = PlanFollower(runner, settings)
        self._nodes = list(problem.nodes)

    def __call__(
        self,
        now: float,
        pending: set[Build],
        running: dict[Build, Running],
        pushed: dict[Build, str],
    ) -> list[tuple[Build, str]]:
        empty: frozenset[Build] = frozenset()
        deps = self.problem.deps
        state = FarmState(
            now_s=now,
            pending={b: deps.get(b, empty) for b in pending},
            running=dict(running),
            nodes=self._nodes,
            cost=self.problem.cost,
            built_on=dict(pushed),
        )
        return [(s.build, s.node) for s in self.follower.tick(state).starts]

    def wake(self) -> float | None:
        return self.follower.next_check_s()
