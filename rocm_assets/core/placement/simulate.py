"""A discrete-event simulator of the farm: how a placement policy plays out, build by build.

Nothing here re-implements placement. Time advances from one build's end to the next; at each
event a policy says which builds start where, with the arguments the run coordinator has (pending
builds, running ones with their estimated ends, where finished ones were built). A build's
estimated duration is the cost model's occupancy (`Problem.index.occupancy`: pulls of inputs
built elsewhere, build, push), the figure `validate_schedule` checks, and every simulated
schedule is validated against it. With `factors` (seeded noise, `noise_factors`) a build really
takes its estimate times its factor, while policies still see only the estimates. The benchmark
and the tests drive it.
"""

import random
from collections.abc import Callable, Iterable, Mapping

from rocm_assets.core.build.builds import Build
from rocm_assets.core.placement.bounds import lower_bounds, validate_schedule
from rocm_assets.core.placement.farm import Running
from rocm_assets.core.placement.online import choose_placements
from rocm_assets.core.placement.problem import EPS, Assignment, Problem, Schedule

# Noise of real durations around the estimates: lognormal, sigma 0.3 (about +-30%).
NOISE_SIGMA = 0.3


class SimulationError(RuntimeError):
    """The simulation found an inconsistency (a stalled or invalid schedule): a bug to report."""


Policy = Callable[
    [float, set[Build], dict[Build, Running], dict[Build, str]],
    Iterable[tuple[Build, str]],
]


def noise_factors(problem: Problem, seed: str, sigma: float = NOISE_SIGMA) -> dict[Build, float]:
    """Each build's real duration over its estimate: lognormal around 1, drawn from `seed`."""
    rng = random.Random(seed)
    return {b: rng.lognormvariate(0.0, sigma) for b in problem.index.builds}


def simulate(
    problem: Problem,
    policy: Policy,
    label: str,
    *,
    factors: Mapping[Build, float] | None = None,
    wake: Callable[[], float | None] | None = None,
    held: Mapping[str, float] | None = None,
) -> Schedule:
    """Run `problem` from time 0, asking `policy` at every event which builds start where.

    An event is the start (time 0), a build's push ending, or a time `wake` asks for (the
    follower's next drift check: the daemon ticks all the time, not only when a build ends).
    The policy sees running builds with their estimated ends; with `factors` they really end at
    start + estimate x factor. The problem's placed builds run on their nodes until their ends
    (or are pushed already), and a node in `held` runs a stand-in build `held:<node>` until
    the time given. The simulator enforces what the farm enforces (one build per node, inputs
    pushed before a start) and raises SimulationError if the policy breaks it or leaves builds
    pending with nothing running.
    """
    ix = problem.index
    n = len(ix.builds)
    node_pos = {name: p for p, name in enumerate(ix.names)}
    node_of, start, end = [-1] * n, [0.0] * n, [0.0] * n
    pending = set(ix.builds)
    running: dict[Build, Running] = {}
    true_end: dict[Build, float] = {}
    pushed: dict[Build, str] = {}
    for b, placed in problem.placed.items():
        if placed.end_s > EPS:
            running[b], true_end[b] = Running(placed.node, 0.0, placed.end_s), placed.end_s
        else:
            pushed[b] = placed.node
    for node, until in (held or {}).items():
        if until > EPS:
            stand_in = Build(f"held:{node}")
            running[stand_in], true_end[stand_in] = Running(node, 0.0, until), until
    now = 0.0
    while pending or running:
        busy = {r.node for r in running.values()}
        for b, node in policy(now, pending, running, pushed):
            i = ix.pos[b]
            if b not in pending or node in busy:
                raise SimulationError(
                    f"{label}: {b} started on {node} at {now:.0f}s twice or on a busy node"
                )
            if ix.fixed_ready[i] > now + EPS or any(
                ix.builds[k] not in pushed for k in ix.preds[i]
            ):
                raise SimulationError(
                    f"{label}: {b} started at {now:.0f}s before its inputs were pushed"
                )
            _, local = ix.inputs(i, node_of, end)
            p = node_pos[node]
            estimate = ix.occupancy(i, p, local)
            real = estimate * (factors[b] if factors is not None else 1.0)
            node_of[i], start[i], end[i] = p, now, now + real
            running[b] = Running(node, now, now + estimate)
            true_end[b] = end[i]
            pending.discard(b)
            busy.add(node)
        if not running:
            raise SimulationError(
                f"{label}: stalled at {now:.0f}s with {len(pending)} builds pending"
            )
        later = min(true_end.values())
        asked = wake() if wake is not None else None
        now = asked if asked is not None and now < asked < later else later
        for b in [b for b, e in true_end.items() if e <= now]:
            pushed[b] = running.pop(b).node
            del true_end[b]
    assignments = sorted(
        (Assignment(ix.builds[i], ix.names[node_of[i]], start[i], end[i]) for i in range(n)),
        key=lambda a: (a.start_s, a.node, a.build),
    )
    schedule = Schedule(
        label, tuple(assignments), max(end, default=0.0), lower_bounds(problem).best
    )
    errors = validate_schedule(problem, schedule, factors)
    if errors:
        raise SimulationError(f"{label}: the simulated schedule is invalid: {errors[0]}")
    return schedule


def online(problem: Problem, strategy: str, *, locality: bool = False) -> Policy:
    """The coordinator's decision at each event: `choose_placements` with the same arguments
    it passes. `locality=True` also passes the node each finished build is on (`pushed`), as the
    coordinator does; without it a finished input counts as published (its pull charged on every
    node) while the simulator charges pulls as they really happen."""
    nodes = list(problem.nodes)

    def decide(
        now: float,
        pending: set[Build],
        running: dict[Build, Running],
        pushed: dict[Build, str],
    ) -> list[tuple[Build, str]]:
        decision = choose_placements(
            list(pending),
            {b: (r.node, r.est_end_s) for b, r in running.items()},
            nodes,
            problem.cost,
            now,
            problem.deps,
            pushed if locality else None,
            strategy,
        )
        return [(s.build, s.node) for s in decision.starts]

    return decide


def follow(problem: Problem, schedule: Schedule) -> Policy:
    """A static plan followed online: each node takes its builds in the plan's order, each as
    soon as the node is free and its inputs are pushed."""
    queues: dict[str, list[Build]] = {}
    for a in sorted(schedule.assignments, key=lambda a: (a.start_s, a.end_s)):
        queues.setdefault(a.node, []).append(a.build)
    for queue in queues.values():
        queue.reverse()
    empty: frozenset[Build] = frozenset()

    def decide(
        now: float,
        pending: set[Build],
        running: dict[Build, Running],
        pushed: dict[Build, str],
    ) -> list[tuple[Build, str]]:
        busy = {r.node for r in running.values()}
        starts = []
        for node, queue in queues.items():
            if node in busy or not queue:
                continue
            b = queue[-1]
            if not any(d in pending or d in running for d in problem.deps.get(b, empty)):
                starts.append((queue.pop(), node))
        return starts

    return decide


def rollout(problem: Problem, busy_until: Mapping[str, float]) -> Schedule:
    """The shorter of two online decisions played out on the estimates from the problem's
    origin (placed builds running to their ends, busy nodes held): `default` with locality,
    often shorter than any one heuristic's static plan, and the seed's greedy rule as it ran
    (no locality), so a plan warm-started from this is never longer than greedy's."""
    played = [
        simulate(problem, online(problem, "default", locality=True), "rollout", held=busy_until),
        simulate(problem, online(problem, "greedy"), "rollout", held=busy_until),
    ]
    return min(played, key=lambda s: s.makespan_s)


def serial_plan(problem: Problem, node: str, label: str) -> Schedule:
    """Every build on `node`, one after another in dependency order."""
    ix = problem.index
    order = [ix.builds[i] for i in ix.topo]
    fake = tuple(Assignment(b, node, float(k), float(k)) for k, b in enumerate(order))
    return simulate(problem, follow(problem, Schedule(label, fake, 0.0, 0.0)), label)
