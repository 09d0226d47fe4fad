"""The benchmark's scenarios: fleets, graphs and random families, all drawn from one seed."""

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.build.builds import Build, build_deps, builds_for
from rocm_assets.core.common.constants import DEFAULT_GROUP
from rocm_assets.core.nodes.fleet import Fleet, Node, Reference, TargetCost
from rocm_assets.core.placement import CostModel, Problem
from rocm_assets.core.placement.farm import FollowSettings

TARGET_SOLVER_LIMIT_S = 10.0
# The coordinator's solver budget for re-plans in the bench (its first plan gets the
# scenario's solver limit, `results._Solves`): the daemon's budget function with its cap (a
# minute) mapped to this share of the scenario's solver limit, in CP-SAT's deterministic
# seconds (so seeded runs reproduce; one is several wall seconds on this 2-core machine).
COORDINATOR_BUDGET_SHARE = 0.25
# Noisy runs per scenario at least (a scenario with fewer instances draws the noise again):
# a median of six draws still swung by one draw (shipped-5arch: the coordinator shorter in 4
# of 6 draws, its median 2.5% longer), so twelve.
NOISE_SAMPLES = 12
# The full bench's solver limits besides TARGET_SOLVER_LIMIT_S (the named scenarios' and
# solver-100's): each random instance's, and the calibration family's, long enough to prove
# most optima. A scenario's figures judge a target only when solved for its full limit.
FAMILY_SOLVER_LIMIT_S = 2.0
PROOF_SOLVER_LIMIT_S = 20.0


def coordinator_settings(solver_limit_s: float) -> FollowSettings:
    """The daemon's follower settings with the re-plans' solver budget scaled to the scenario."""
    daemon = FollowSettings()
    return daemon.scaled(
        solver_limit_s / daemon.solver_time_limit_seconds * COORDINATOR_BUDGET_SHARE
    )


@dataclass(frozen=True)
class Instance:
    name: str
    problem: Problem
    first_node: str


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    instances: tuple[Instance, ...]
    solver_limit_s: float
    gantt: bool = False
    # The full bench's limit for it: its ratios to the bound rest on the solver's time for the
    # plans and the bounds alike, so solved for less (a quick run) they judge no target.
    judged_at_s: float = TARGET_SOLVER_LIMIT_S


def skewed_fleet(base: Fleet) -> Fleet:
    """The seed's two boxes plus three more, uplinks from 40 to 1000 Mbit/s (25x), costs as in
    `base`. The 16-core/15 GB box is first: buildx's platform match landed everything there."""
    nodes = (
        Node(name="gaming", builder="gaming", cores=16, mem_gb=15.0, link_mbps=100.0),
        Node(name="think", builder="think", cores=32, mem_gb=122.0, link_mbps=1000.0),
        Node(name="lab", builder="lab", cores=24, mem_gb=64.0, link_mbps=400.0),
        Node(name="nuc", builder="nuc", cores=8, mem_gb=32.0, link_mbps=40.0),
        Node(name="homelab", builder="homelab", cores=32, mem_gb=64.0, link_mbps=40.0),
    )
    return Fleet(nodes=nodes, reference=base.reference, costs=base.costs)


def random_fleet(
    rng: random.Random,
    costs: Mapping[str, TargetCost],
    reference: Reference,
    size: int | None = None,
) -> Fleet:
    """`size` (default 2-12) nodes: cores 8-64, 12-256 GB, uplinks 40-1000 Mbit/s, log-uniform,
    so a 25x span."""
    nodes = tuple(
        Node(
            name=f"n{p:02d}",
            builder=f"n{p:02d}",
            cores=rng.choice([8, 12, 16, 24, 32, 48, 64]),
            mem_gb=float(round(12 * (256 / 12) ** rng.random())),
            link_mbps=float(round(40 * 25 ** rng.random())),
        )
        for p in range(size or rng.randint(2, 12))
    )
    return Fleet(nodes=nodes, reference=reference, costs=dict(costs))


def arch_names(graph: BakeGraph, count: int) -> list[str]:
    """The bake file's arches in order, then made-up ones when a scenario needs more."""
    extra = [f"gfx-x{k}" for k in range(max(0, count - len(graph.arches)))]
    return [*graph.arches, *extra][:count]


def real_builds(
    graph: BakeGraph, arches: Sequence[str]
) -> tuple[tuple[Build, ...], dict[Build, frozenset[Build]]]:
    """The default group for `arches`, expanded and wired as the coordinator does."""
    builds = tuple(builds_for(graph, graph.select([DEFAULT_GROUP]), arches))
    return builds, {b: build_deps(graph, b) for b in builds}


def random_dag(
    rng: random.Random,
    arches: Sequence[str],
    targets: int | None = None,
    noarch_share: float = 0.15,
) -> tuple[tuple[Build, ...], dict[Build, frozenset[Build]], dict[str, TargetCost]]:
    """A random graph shaped like the real one: a serial neck (runtime -> base -> framework) of
    heavy images, then targets that hang off the framework and take 0-3 more inputs among the
    earlier ones (joins), some of them noarch; costs 1 min-3 h, outputs 30 MB-8 GB.
    `targets` defaults to 8-20."""
    count = targets or rng.randint(8, 20)
    neck = rng.randint(2, 3)
    names = [f"t{k:02d}" for k in range(count)]
    noarch = {t for t in names[1:] if rng.random() < noarch_share}
    parents: dict[str, set[str]] = {names[0]: set()}
    for k in range(1, count):
        if k < neck:
            parents[names[k]] = {names[k - 1]}
            continue
        earlier = names[neck:k]
        extra = rng.sample(earlier, min(len(earlier), rng.choice([0, 0, 1, 1, 2, 3])))
        parents[names[k]] = {names[neck - 1], *extra}
    costs = {
        t: TargetCost(
            seconds=float(round(60 * 180 ** rng.random())),
            size_gb=round(0.03 * (8 / 0.03) ** rng.random(), 3),
        )
        for t in names
    }
    # The neck is the long, heavy part, as rocm-runtime -> pytorch-base -> pytorch is.
    for k in range(neck):
        costs[names[k]] = TargetCost(
            seconds=float(round(rng.uniform(600, 10800))), size_gb=round(rng.uniform(2, 10), 2)
        )

    def build(target: str, arch: str) -> Build:
        return Build(target, None if target in noarch else arch)

    deps: dict[Build, frozenset[Build]] = {}
    for arch in arches:
        for t in names:
            # A noarch target builds against the first arch's inputs, as build_deps wires it.
            on = arches[0] if t in noarch else arch
            deps.setdefault(build(t, arch), frozenset(build(d, on) for d in parents[t]))
    return tuple(deps), deps, costs


@dataclass(frozen=True)
class Settings:
    """How big a run is. `quick` is a CI-sized run; the full one is what docs/benchmarks.md shows.

    The solver's limits: `named_solver_s` on the shipped and skewed scenarios, `family_solver_s`
    on each random instance, `scale_solver_s` on the 100-build family, `proof_solver_s` on the
    calibration family (random instances given long enough to prove most optima).
    """

    seed: int
    family_size: int
    family_solver_s: float
    named_solver_s: float
    scale_instances: int
    scale_solver_s: float
    proof_instances: int
    proof_solver_s: float
    decision_repeats: int
    load_repeats: int
    tick_repeats: int
    noise_samples: int
    workers: int

    def noise_draws(self, instances: int) -> int:
        """Noise draws per instance: enough that a scenario has `noise_samples` noisy runs (a
        single-instance scenario under one draw would be a coin toss between strategies)."""
        return max(1, -(-self.noise_samples // max(1, instances)))

    @classmethod
    def make(cls, seed: int, quick: bool, workers: int, instances: int | None = None) -> "Settings":
        if quick:
            return cls(
                seed=seed,
                family_size=instances or 20,
                family_solver_s=0.5,
                named_solver_s=1.0,
                scale_instances=1,
                scale_solver_s=2.0,
                proof_instances=1,
                proof_solver_s=2.0,
                decision_repeats=3,
                load_repeats=1,
                tick_repeats=3,
                noise_samples=1,
                workers=workers,
            )
        return cls(
            seed=seed,
            family_size=instances or 200,
            family_solver_s=FAMILY_SOLVER_LIMIT_S,
            named_solver_s=TARGET_SOLVER_LIMIT_S,
            scale_instances=4,
            scale_solver_s=TARGET_SOLVER_LIMIT_S,
            proof_instances=6,
            proof_solver_s=PROOF_SOLVER_LIMIT_S,
            decision_repeats=15,
            load_repeats=3,
            tick_repeats=9,
            noise_samples=NOISE_SAMPLES,
            workers=workers,
        )


def make_problem(
    builds: Sequence[Build], deps: Mapping[Build, frozenset[Build]], fleet: Fleet
) -> Problem:
    return Problem(tuple(builds), deps, fleet.nodes, CostModel(fleet))


def _random_real(rng: random.Random, graph: BakeGraph, fleet: Fleet, name: str) -> Instance:
    """The real graph for 1-5 arches, the shipped costs each scaled 1/3-3x (log-uniform), on a
    random fleet of 2-12 nodes."""
    builds, deps = real_builds(graph, arch_names(graph, rng.randint(1, len(graph.arches))))
    costs = {
        t: TargetCost(
            seconds=c.seconds * 3 ** rng.uniform(-1, 1),
            size_gb=c.size_gb * 3 ** rng.uniform(-1, 1),
        )
        for t, c in fleet.costs.items()
    }
    nodes = random_fleet(rng, costs, fleet.reference)
    return Instance(name, make_problem(builds, deps, nodes), nodes.nodes[0].name)


def _random_dag(rng: random.Random, graph: BakeGraph, fleet: Fleet, name: str) -> Instance:
    """A random DAG (`random_dag`) for 1-5 arches on a random fleet of 2-12 nodes."""
    arches = arch_names(graph, rng.randint(1, len(graph.arches)))
    builds, deps, costs = random_dag(rng, arches)
    nodes = random_fleet(rng, costs, fleet.reference)
    return Instance(name, make_problem(builds, deps, nodes), nodes.nodes[0].name)


def scenarios(graph: BakeGraph, fleet: Fleet, settings: Settings) -> list[Scenario]:
    """The issue's scenarios, drawn from `settings.seed`."""
    rng = random.Random(settings.seed)
    skewed = skewed_fleet(fleet)
    out: list[Scenario] = []
    for name, chosen, text in (
        ("shipped", fleet, "fleet.yaml and rocm-bake.hcl, default group"),
        ("skewed", skewed, "16c/15GB beside 32c/122GB, uplinks 40-1000 Mbit/s"),
    ):
        for arches in (1, len(graph.arches)):
            builds, deps = real_builds(graph, arch_names(graph, arches))
            label = f"{name}-{arches}arch"
            out.append(
                Scenario(
                    label,
                    f"{text}, {arches} arch{'es' if arches > 1 else ''}",
                    (Instance(label, make_problem(builds, deps, chosen), chosen.nodes[0].name),),
                    settings.named_solver_s,
                    gantt=True,
                )
            )
    out.append(
        Scenario(
            "random-real",
            "real graph, 1-5 arches, shipped costs scaled 1/3-3x, random fleets of 2-12 nodes",
            tuple(
                _random_real(rng, graph, fleet, f"real-{k:03d}")
                for k in range(settings.family_size)
            ),
            settings.family_solver_s,
            judged_at_s=FAMILY_SOLVER_LIMIT_S,
        )
    )
    out.append(
        Scenario(
            "random-dag",
            "random DAGs of 8-20 targets (neck, fan-out, joins), 1-5 arches, random fleets of "
            "2-12 nodes",
            tuple(
                _random_dag(rng, graph, fleet, f"dag-{k:03d}") for k in range(settings.family_size)
            ),
            settings.family_solver_s,
            judged_at_s=FAMILY_SOLVER_LIMIT_S,
        )
    )
    proof = []
    for k in range(settings.proof_instances):
        draw = _random_real if k % 2 == 0 else _random_dag
        proof.append(draw(rng, graph, fleet, f"proof-{k:02d}"))
    out.append(
        Scenario(
            "random-proof",
            "drawn as random-real and random-dag alternately, solver given long enough to prove "
            "most optima: how far the heuristics and placement's lower bound really are",
            tuple(proof),
            settings.proof_solver_s,
            judged_at_s=PROOF_SOLVER_LIMIT_S,
        )
    )
    scale = []
    for k in range(settings.scale_instances):
        # Twenty targets for five arches, every target per arch: exactly 100 builds.
        builds, deps, costs = random_dag(rng, arch_names(graph, 5), targets=20, noarch_share=0.0)
        nodes = random_fleet(rng, costs, fleet.reference, size=12)
        scale.append(
            Instance(f"scale-{k:02d}", make_problem(builds, deps, nodes), nodes.nodes[0].name)
        )
    out.append(
        Scenario(
            "solver-100",
            "100 builds (random DAG of 20 targets x 5 arches) on 12 random nodes",
            tuple(scale),
            settings.scale_solver_s,
        )
    )
    return out
