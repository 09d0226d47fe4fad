"""What a build is, and which builds a request asks for: one vocabulary for every layer.

A build is one bake target for one GPU arch (`arch` None for a noarch target). The coordinator,
preflight, placement, the CLI and the benchmarks all speak of `Build`s, and every command that
takes a group, targets or arches checks them here, so a request is refused with the same words
wherever it is made.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import total_ordering

from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.common.constants import (
    PARTITION_RANGE_END_TAG,
    PARTITION_RANGE_START_TAG,
    PARTITION_TAG,
)
from rocm_assets.core.common.names import arch_problem, op_name as op_name
from rocm_assets.core.common.text import quote


class SelectionError(ValueError):
    """A group, target or arch the bake file does not have; one line saying what it has."""


@total_ordering
@dataclass(frozen=True)
class Build:
    """One bake target for one GPU arch; `arch` is None for a noarch target."""

    target: str
    arch: str | None = None

    def __str__(self) -> str:
        return f"{self.target}@{self.arch}" if self.arch else self.target

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Build):
            return NotImplemented
        return (self.target, self.arch or "") < (other.target, other.arch or "")

    @classmethod
    def parse(cls, text: str) -> "Build":
        """The inverse of `str()`: `target@arch` or a bare noarch `target`."""
        target, _, arch = text.partition("@")
        return cls(target, arch or None)


def build_deps(graph: BakeGraph, build: Build) -> frozenset[Build]:
    """The builds `build` reads from the registry: its deps, for its arch or noarch."""
    arch = build.arch or graph.arches[0]
    return frozenset(
        Build(d, arch if d in graph.per_arch else None) for d in graph.deps[build.target]
    )


def builds_for(graph: BakeGraph, targets: Iterable[str], arches: Sequence[str]) -> list[Build]:
    """One build per per-arch target and arch, one per noarch target, in dependency order."""
    wanted = set(targets)
    builds: list[Build] = []
    for target in graph.targets:
        if target not in wanted:
            continue
        if target in graph.per_arch:
            builds.extend(Build(target, a) for a in arches)
        else:
            builds.append(Build(target, None))
    return builds


def run_partitions(tags: Mapping[str, str], arches: Sequence[str]) -> list[str]:
    """The arch partitions a run covers: its partition tag or its partition range tags."""
    if tags.get(PARTITION_TAG):
        return [tags[PARTITION_TAG]]
    start, end = tags.get(PARTITION_RANGE_START_TAG), tags.get(PARTITION_RANGE_END_TAG)
    if start in arches and end in arches:
        i, j = arches.index(start), arches.index(end)
        return list(arches[min(i, j) : max(i, j) + 1])
    return []


def check_arches(graph: BakeGraph, arches: Iterable[str]) -> tuple[str, ...]:
    """`arches` without repeats, each one of the bake file's GPU_ARCHES.

    The name's shape is checked first, so a value like `gfx942;rm -rf /` is refused for what it
    is before it is looked up, and never reaches an argv, an env value or a tag.
    """
    chosen = tuple(dict.fromkeys(arches))
    for arch in chosen:
        problem = arch_problem(arch)
        if problem:
            raise SelectionError(problem)
        if arch not in graph.arches:
            raise SelectionError(
                f"unknown arch {arch!r}: {graph.path.name} builds {', '.join(graph.arches)} "
                "(add it to GPU_ARCHES there to make it a partition)"
            )
    return chosen


def check_group(graph: BakeGraph, group: str) -> tuple[str, ...]:
    """The members of bake group `group`."""
    if group not in graph.groups:
        raise SelectionError(
            f"no group {quote(group)} in {graph.path.name} (groups: {', '.join(graph.groups)})"
        )
    return graph.groups[group]


def select_targets(
    graph: BakeGraph,
    *,
    group: str | None = None,
    targets: Sequence[str] | None = None,
    allow_tests: bool = False,
) -> tuple[str, ...]:
    """The targets of a group or a target list, checked, in dependency order.

    Test targets are refused unless `allow_tests`: they run as checks on a GPU node, not in the
    build graph.
    """
    if group is not None:
        chosen = set(check_group(graph, group))
    else:
        chosen = set(targets or ())
        for name in targets or ():
            if name in graph.test_targets and not allow_tests:
                raise SelectionError(
                    f"{quote(name)} is a test target, not an asset: it runs as the check on "
                    f"{graph.test_targets[name]} (make gpu-test)"
                )
            if name not in graph.deps:
                raise SelectionError(
                    f"no target {quote(name)} in {graph.path.name} "
                    f"(targets: {', '.join(graph.asset_targets)})"
                )
    allowed = graph.targets if allow_tests else graph.asset_targets
    selected = tuple(t for t in allowed if t in chosen)
    if not selected:
        raise SelectionError(f"group {quote(group)} in {graph.path.name} has no asset to build")
    return selected
