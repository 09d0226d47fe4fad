"""Placement stand-ins and problems: the fleet's attribute names without pydantic.

Placement reads nodes, costs and probes through Protocols, so these frozen dataclasses fit; the
seed's graph comes from `helpers.seed`, the one copy of it in the tests.
"""

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from rocm_assets.core.build.builds import Build
from rocm_assets.core.placement import CostModel, Placed, Problem, max_jobs
from rocm_assets.core.placement.runners import SolveOutcome, SolveRequest
from rocm_assets_tests.helpers.seed import SEED_GRAPH


@dataclass(frozen=True)
class FakeNode:
    name: str
    cores: int = 32
    mem_gb: float = 122.0
    link_mbps: float = 1000.0
    builder: str = ""
    ssh: str | None = None
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True)
class FakeCost:
    seconds: float
    size_gb: float


@dataclass(frozen=True)
class FakeReference:
    cores: int = 32
    mem_gb: float = 122.0


@dataclass(frozen=True)
class FakeFleet:
    nodes: tuple[FakeNode, ...]
    costs: Mapping[str, FakeCost] = field(default_factory=dict)
    reference: FakeReference = FakeReference()
    default: FakeCost = FakeCost(600.0, 1.0)

    def cost(self, target: str) -> FakeCost:
        return self.costs.get(target, self.default)


@dataclass(frozen=True)
class FakeProbe:
    node: str
    ok: bool = True
    reason: str | None = None
    mem_available_gb: float | None = None
    cores: int | None = None
    idle_cores: float | None = None


SEED_NOARCH = {"pytorch-src", "triton-wheel"}


def seed_builds(arches: list[str]) -> tuple[tuple[Build, ...], dict[Build, frozenset[Build]]]:
    """The seed's default group for `arches`; noarch targets are built once."""

    def build(target: str, arch: str) -> Build:
        return Build(target, None if target in SEED_NOARCH else arch)

    deps = {
        build(t, a): frozenset(build(d, a) for d in inputs)
        for a in arches
        for t, inputs in SEED_GRAPH.items()
    }
    return tuple(sorted(deps)), deps


def random_problem(rng: random.Random, max_nodes: int = 12, max_targets: int = 24) -> Problem:
    """A random fleet of 2..max_nodes nodes (links spanning 25x) and a random DAG: the seed graph
    for 1..3 arches or a layered random graph; part of it requested, the rest taken as published;
    sometimes measured durations and already-placed inputs."""
    nodes = tuple(
        FakeNode(
            f"n{p:02d}",
            cores=rng.choice([8, 16, 24, 32, 48, 64]),
            mem_gb=rng.uniform(12, 256),
            link_mbps=40 * 25 ** rng.random(),
        )
        for p in range(rng.randint(2, max_nodes))
    )
    if rng.random() < 0.3:
        builds, deps = seed_builds([f"gfx{900 + a}" for a in range(rng.randint(1, 3))])
        targets = list(SEED_GRAPH)
    else:
        targets = [f"t{k:02d}" for k in range(rng.randint(1, max_targets))]
        deps = {}
        for k, t in enumerate(targets):
            arch = None if rng.random() < 0.15 else "gfx942"
            earlier = [b for b in deps if int(b.target[1:]) < k]
            chosen = rng.sample(earlier, min(len(earlier), rng.randint(0, 3)))
            deps[Build(t, arch)] = frozenset(chosen)
        builds = tuple(sorted(deps))
    costs = {t: FakeCost(60 * 180 ** rng.random(), rng.uniform(0.05, 12)) for t in targets}
    fleet = FakeFleet(nodes, costs)
    requested = tuple(b for b in builds if rng.random() < 0.85) or builds[:1]
    outside = [b for b in builds if b not in requested]
    placed = {
        b: Placed(rng.choice(nodes).name, rng.uniform(-100, 3000))
        for b in outside
        if rng.random() < 0.5
    }
    measured = {
        (t, node.name, max_jobs(node)): 60 * 180 ** rng.random()
        for t in targets
        for node in nodes
        if rng.random() < 0.1
    }
    return Problem(requested, deps, nodes, CostModel(fleet, measured=measured), placed)


def make_problem(
    nodes: tuple[FakeNode, ...], costs: dict[str, FakeCost], deps: dict[Build, frozenset[Build]]
) -> Problem:
    return Problem(tuple(deps), deps, nodes, CostModel(FakeFleet(nodes, costs)))


def lpt_trap() -> Problem:
    """Two equal nodes. head (20 s) gates tail (100 s); side1 and side2 (50 s each) are longer
    than head, so the seed's LPT rule starts them first and the chain waits: 50 + 20 + 100.
    Upward rank starts head at once: 20 + 100, the sides fill the other node."""
    nodes = (FakeNode("n1"), FakeNode("n2"))
    head, tail, side1, side2 = Build("head"), Build("tail"), Build("side1"), Build("side2")
    costs = {
        t: FakeCost(s, 0.001)
        for t, s in {"head": 20, "tail": 100, "side1": 50, "side2": 50}.items()
    }
    deps = {head: frozenset(), tail: frozenset({head}), side1: frozenset(), side2: frozenset()}
    return make_problem(nodes, costs, deps)


class ScriptedRunner:
    """A solver runner whose outcomes the test hands out: records every request it is given."""

    def __init__(self) -> None:
        self.requests: list[SolveRequest] = []
        self.outcomes: list[SolveOutcome] = []
        self.closed = False

    def submit(self, request: SolveRequest) -> None:
        self.requests.append(request)

    def poll(self) -> SolveOutcome | None:
        return self.outcomes.pop(0) if self.outcomes else None

    def close(self) -> None:
        self.closed = True
