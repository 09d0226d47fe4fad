"""Preflight: before any build starts, check that every image the builds read is in the registry.

Pure core (no dagster). With PUBLISHED_INPUTS=1 a build reads its inputs from the registry (the
`PUB_*` args and `docker-image://` contexts, `BakeGraph.published_inputs`); an input that nothing
in the request builds must already be published, or the build dies resolving it 0 s in. Each
missing image is named with the targets that need it and the asset, partition and command that
create it. Registry errors raise `RegistryError`: an error is never reported as "missing".

Requests grow with repositories, not images: one `tags/list` per repository (paged) answers for
every tag needed from it.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.build.builds import Build
from rocm_assets.core.common.constants import DEFINITIONS_MODULE

if TYPE_CHECKING:
    from rocm_assets.core.registry.client import RegistryClient


class PreflightError(ValueError):
    """A build list that does not fit the bake graph (unknown target, wrong partition)."""


@dataclass(frozen=True)
class Missing:
    """An input image that is not published and that nothing in the request builds."""

    image: str
    needed_by: list[str]
    asset: str
    partition: str | None
    command: str

    def line(self) -> str:
        where = f"asset {self.asset}" + (f" partition {self.partition}" if self.partition else "")
        return (
            f"missing {self.image}: needed by {', '.join(self.needed_by)}; "
            f"built by {where}: {self.command}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "needed_by": list(self.needed_by),
            "asset": self.asset,
            "partition": self.partition,
            "command": self.command,
        }


@dataclass(frozen=True)
class PreflightReport:
    """What a preflight found. `unchecked`: inputs on another host than the registry."""

    registry: str
    builds: int
    checked: int
    missing: list[Missing] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing

    def summary(self) -> str:
        checked = f"{_count(self.checked, 'input image')} of {_count(self.builds, 'build')}"
        if self.missing:
            them = "it" if len(self.missing) == 1 else "them"
            text = (
                f"preflight: {len(self.missing)} of {checked} not published on {self.registry}, "
                f"and nothing in this run builds {them}: build {them} first"
            )
        else:
            text = f"preflight: {checked} checked, all on {self.registry}"
        if self.unchecked:
            text += (
                f"; {len(self.unchecked)} on other hosts not checked "
                f"({', '.join(self.unchecked[:3])}{', ...' if len(self.unchecked) > 3 else ''})"
            )
        return text

    def to_json(self) -> dict[str, Any]:
        return {"missing": [m.to_json() for m in self.missing], "checked": self.checked}


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def materialize_command(target: str, partition: str | None) -> str:
    """The command that builds one asset partition (no --partition for a noarch target)."""
    command = f"dagster asset materialize -m {DEFINITIONS_MODULE} --select {target}"
    return f"{command} --partition {partition}" if partition else command


def _checked_builds(graph: BakeGraph, builds: Iterable[Build], what: str) -> list[Build]:
    checked: list[Build] = []
    for build in builds:
        target, partition = build.target, build.arch
        if target not in graph.deps:
            raise PreflightError(f"{what}: no target {target!r} in {graph.path.name}")
        if target in graph.per_arch:
            if partition not in graph.arches:
                raise PreflightError(
                    f"{what}: {target} is built per arch; its partition must be one of "
                    f"{', '.join(graph.arches)}, not {partition!r}"
                )
        elif partition is not None:
            raise PreflightError(
                f"{what}: {target} is noarch and takes no partition, not {partition!r}"
            )
        checked.append(build)
    return list(dict.fromkeys(checked))


@dataclass
class _Need:
    producer: str
    partition: str | None
    needed_by: list[str]


def preflight(
    graph: BakeGraph,
    builds: Iterable[Build],
    client: "RegistryClient",
    *,
    published_by_request: Iterable[Build] = (),
) -> PreflightReport:
    """Check every registry input of `builds` that neither they nor `published_by_request` make.

    `builds` have arch None for noarch targets (`rocm_assets.core.build.builds.builds_for`);
    `published_by_request` are the builds an earlier run of the same request will publish.

    Raises:
        PreflightError: a build that does not fit the graph.
        RegistryError: the registry could not answer (never reported as "missing").
    """
    builds = _checked_builds(graph, builds, "builds")
    earlier = _checked_builds(graph, published_by_request, "published_by_request")
    produced = {tag for b in (*builds, *earlier) for tag in graph.tags(b.target, b.arch)}
    needs: dict[str, _Need] = {}
    for build in builds:
        target = build.target
        arch = graph.build_arch(target, build.arch or graph.arches[0])
        for item in graph.published_inputs(target, arch):
            if item.ref in produced:
                continue
            need = needs.setdefault(
                item.ref,
                _Need(item.producer, arch if item.producer in graph.per_arch else None, []),
            )
            if target not in need.needed_by:
                need.needed_by.append(target)
    unchecked = sorted(ref for ref in needs if not client.is_local(ref))
    wanted: dict[str, dict[str, str]] = {}
    for ref in needs:
        if ref not in unchecked:
            repo, tag = client.split_ref(ref)
            wanted.setdefault(repo, {})[tag] = ref
    missing_refs = set()
    for repo in sorted(wanted):
        present = set(client.tags(repo))
        missing_refs.update(ref for tag, ref in wanted[repo].items() if tag not in present)
    order = {name: index for index, name in enumerate(graph.targets)}
    missing = [
        Missing(
            image=ref,
            needed_by=sorted(needs[ref].needed_by, key=order.__getitem__),
            asset=needs[ref].producer,
            partition=needs[ref].partition,
            command=materialize_command(needs[ref].producer, needs[ref].partition),
        )
        for ref in sorted(missing_refs, key=lambda r: (order[needs[r].producer], r))
    ]
    return PreflightReport(
        registry=client.url,
        builds=len(builds),
        checked=sum(len(tags) for tags in wanted.values()),
        missing=missing,
        unchecked=unchecked,
    )
