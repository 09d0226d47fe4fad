"""The bake file as a build graph: targets, their dependencies, arches and groups.

Everything here is derived from the file; nothing in the code lists targets or edges. An edge is a
`target:` named context, or a `docker-image://` context whose reference is another target's tag.
Which targets are per-arch follows from whether their tags change with the arch variable.
"""

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from rocm_assets.core.bake.answers import BakeAnswers
from rocm_assets.core.bake.errors import BakeError, boundary
from rocm_assets.core.bake.limits import MAX_ARCHES
from rocm_assets.core.bake.manifest import PrintKey
from rocm_assets.core.bake.probe import ALL_GROUP, VALUES_TARGET
from rocm_assets.core.bake.resolvers import Resolver, choose
from rocm_assets.core.bake.runner import bake_verdict
from rocm_assets.core.bake.source import Outline, UnreadableSyntax, read_outline
from rocm_assets.core.bake.targets import ResolvedBake, Target
from rocm_assets.core.common.buildx import find_buildx
from rocm_assets.core.common.constants import ARCH_LIST_ATTR, ARCH_VAR, TEST_TARGETS_ATTR
from rocm_assets.core.common.names import arch_problem, dagster_problems
from rocm_assets.core.common.text import quote


@dataclass(frozen=True, slots=True)
class PublishedInput:
    """An image a target reads from the registry when PUBLISHED_INPUTS=1."""

    ref: str
    producer: str


class BakeGraph:
    """The build graph: buildable targets, their deps, which are per-arch, and the groups.

    Private targets (a leading `_`, bake's convention for inherited bases) are not buildable.
    `from_outline` asks bake and checks its answer; the constructor keeps what it found.
    """

    def __init__(
        self,
        outline: Outline,
        answers: BakeAnswers,
        *,
        arches: tuple[str, ...],
        targets: tuple[str, ...],
        deps: dict[str, tuple[str, ...]],
        per_arch: frozenset[str],
        groups: dict[str, tuple[str, ...]],
        test_targets: dict[str, str],
    ) -> None:
        self.outline = outline
        self.path = outline.path
        self._answers = answers
        self.resolver: Resolver = answers.resolver
        # Bake's JSON for each call made, by (GPU_ARCH or "", PUBLISHED_INPUTS): the manifest.
        self.prints: dict[PrintKey, dict[str, Any]] = answers.prints
        self.arches = arches
        # Buildable targets, dependencies first.
        self.targets = targets
        self.deps = deps
        self.per_arch = per_arch
        self.groups = groups
        # Test targets -> the one target each tests.
        self.test_targets = test_targets

    @classmethod
    def from_outline(cls, outline: Outline, env: Mapping[str, str] | None = None) -> "BakeGraph":
        """Ask bake (or its manifest) for the file's answer and check it into a graph. `env` is
        bake's environment (default: os.environ)."""
        source = os.environ if env is None else env
        path = outline.path
        with boundary(path):
            _refuse_probe_names(outline)
            # The file's own default arch first: bake's values say which arches there are.
            answers = BakeAnswers.ask_default(outline, choose(outline, source), source)
            first = answers.first
            arches = _arches(outline, first.values.get(ARCH_LIST_ATTR))
            default = answers.default_arch
            if default is not None and default not in arches:
                raise BakeError(
                    f"{ARCH_VAR}'s default {quote(default)} is not one of {ARCH_LIST_ATTR} "
                    f"({', '.join(arches)})",
                    path=path,
                    line=outline.line(ARCH_VAR),
                )
            # Every other arch at once: bake runs once per arch, concurrently.
            answers.resolve_all([None, *arches], published=False)
            names = list(first.targets)
            deps = _deps(answers, arches, names, path)
            targets = _topological(deps, names, path)
            per_arch = frozenset(n for n in names if _varies_with_arch(answers, arches, n))
            # In the file's order (bake prints them sorted): `default`, then as written.
            order = {g: i for i, g in enumerate(outline.groups)}
            named = sorted(
                first.groups, key=lambda g: (g != "default", order.get(g, len(order)), g)
            )
            groups = {g: first.expand([g]) for g in named}
            test_targets = _test_targets(outline, first.values.get(TEST_TARGETS_ATTR), deps)
            graph = cls(
                outline,
                answers,
                arches=arches,
                targets=targets,
                deps=deps,
                per_arch=per_arch,
                groups=groups,
                test_targets=test_targets,
            )
            _check_dagster_names(graph, first)
        return graph

    @property
    def default_arch(self) -> str:
        """The arch bake resolves for when GPU_ARCH is unset: the file's default."""
        return self._answers.default_arch or self.arches[0]

    @property
    def resolver_version_text(self) -> str:
        """The buildx version that answered: this host's, or the manifest's writer's."""
        return self.resolver.version_text

    @property
    def resolver_label(self) -> str:
        return self.resolver.label

    @property
    def asset_targets(self) -> tuple[str, ...]:
        """Targets that publish an image: every buildable target but the test targets."""
        return tuple(t for t in self.targets if t not in self.test_targets)

    # ---- evaluation ----
    def prefetch(self, *, published: bool) -> None:
        """Resolve the default and every arch in one input mode, in one batch."""
        self._answers.resolve_all([None, *self.arches], published)

    def resolve(self, arch: str | None, *, published: bool = False) -> ResolvedBake:
        """The file resolved for one arch (default: the bake file's own default) and input mode."""
        if arch and arch not in self.arches:
            raise BakeError(
                f"{ARCH_VAR}={arch} is not one of {ARCH_LIST_ATTR} ({', '.join(self.arches)})",
                path=self.path,
                line=self.outline.line(ARCH_LIST_ATTR),
            )
        return self._answers.get(arch, published)

    # ---- queries ----
    @cached_property
    def edge_count(self) -> int:
        return sum(len(d) for d in self.deps.values())

    def groups_of(self, target: str) -> tuple[str, ...]:
        return tuple(g for g, members in self.groups.items() if target in members)

    def select(self, names: Iterable[str]) -> tuple[str, ...]:
        """Group or target names to buildable targets, in dependency order."""
        chosen = set(self.resolve(None).expand(names))
        unknown = sorted(n for n in chosen if n not in self.deps)
        if unknown:
            raise BakeError(f"{', '.join(unknown)} is not a buildable target", path=self.path)
        return tuple(n for n in self.targets if n in chosen)

    def build_arch(self, target: str, arch: str) -> str:
        """The arch a target is evaluated with: noarch targets build against the first arch."""
        return arch if target in self.per_arch else self.arches[0]

    def tags(self, target: str, arch: str | None = None) -> tuple[str, ...]:
        return self.resolve(self.build_arch(target, arch or self.arches[0])).targets[target].tags

    def published_inputs(self, target: str, arch: str) -> tuple[PublishedInput, ...]:
        """What `target` pulls from the registry with PUBLISHED_INPUTS=1, and who produces it.

        A `target:` context in the default mode becomes, in published mode, the value of the arg
        that named it; `docker-image://` contexts are read from the registry in both modes.
        """
        arch = self.build_arch(target, arch)
        linked = self.resolve(arch).targets[target]
        pub = self.resolve(arch, published=True)
        published = pub.targets[target]
        found: dict[str, PublishedInput] = {}
        for context, producer in linked.target_links.items():
            for arg, value in linked.args.items():
                if value == context and arg in published.args and published.args[arg] != context:
                    found[published.args[arg]] = PublishedInput(published.args[arg], producer)
        for ref in published.image_contexts.values():
            owner = pub.tag_owner(ref)
            if owner and owner != target:
                found[ref] = PublishedInput(ref, owner)
        return tuple(found.values())


# ---- checks of bake's answer, while the graph is made ----
def _refuse_probe_names(outline: Outline) -> None:
    """A file may not declare the names the probe asks bake for its values under."""
    for reserved in (VALUES_TARGET, ALL_GROUP):
        if reserved in outline.targets or reserved in outline.groups:
            raise BakeError(
                f"{quote(reserved)} is the name rocm-assets asks bake for its values "
                "under: rename the block",
                path=outline.path,
                line=outline.targets[reserved][0].line
                if reserved in outline.targets
                else outline.groups[reserved],
            )


def _arches(outline: Outline, raw: Any) -> tuple[str, ...]:
    line = outline.line(ARCH_LIST_ATTR)
    if not isinstance(raw, list) or not raw or not all(isinstance(a, str) and a for a in raw):
        raise BakeError(
            f"{ARCH_LIST_ATTR} must be a non-empty list of GPU arch names",
            path=outline.path,
            line=line,
        )
    arches = tuple(dict.fromkeys(raw))
    if len(arches) > MAX_ARCHES:
        raise BakeError(
            f"{ARCH_LIST_ATTR} has {len(arches)} arches, over the limit of {MAX_ARCHES}",
            path=outline.path,
            line=line,
        )
    for arch in arches:
        problem = arch_problem(arch)
        if problem:
            raise BakeError(f"{ARCH_LIST_ATTR}: {problem}", path=outline.path, line=line)
    return arches


def _deps(
    answers: BakeAnswers, arches: tuple[str, ...], names: list[str], path: Path
) -> dict[str, tuple[str, ...]]:
    """Each target's dependencies: its edges under every arch, together."""
    deps: dict[str, set[str]] = {n: set() for n in names}
    for arch in arches:
        resolved = answers.get(arch, False)
        for name in names:
            deps[name] |= _edges(resolved, resolved.targets[name], path)
    return {n: tuple(sorted(d)) for n, d in deps.items()}


def _edges(resolved: ResolvedBake, target: Target, path: Path) -> set[str]:
    edges = set()
    for context, linked in target.target_links.items():
        if linked not in resolved.targets:
            raise BakeError(
                f"target {target.name!r}: context {context!r} links target:{linked}, but there is "
                f"no target named {linked!r}",
                path=path,
                line=target.line,
            )
        if linked.startswith("_"):
            raise BakeError(
                f"target {target.name!r}: context {context!r} links private target {linked!r}",
                path=path,
                line=target.line,
            )
        edges.add(linked)
    for ref in target.image_contexts.values():
        owner = resolved.tag_owner(ref)
        if owner and owner != target.name and not owner.startswith("_"):
            edges.add(owner)
    return edges


def _topological(
    deps: Mapping[str, tuple[str, ...]], names: list[str], path: Path
) -> tuple[str, ...]:
    """Dependencies first; iterative, so a long chain of targets cannot overflow the stack."""
    order: list[str] = []
    state: dict[str, int] = {}
    for root in names:
        if state.get(root):
            continue
        chain: list[str] = [root]
        pending: list[list[str]] = [list(deps[root])]
        state[root] = 1
        while chain:
            if pending[-1]:
                dep = pending[-1].pop(0)
                if state.get(dep) == 1:
                    cycle = [*chain[chain.index(dep) :], dep]
                    raise BakeError(f"dependency cycle: {' -> '.join(cycle)}", path=path)
                if not state.get(dep):
                    state[dep] = 1
                    chain.append(dep)
                    pending.append(list(deps[dep]))
            else:
                done = chain.pop()
                pending.pop()
                state[done] = 2
                order.append(done)
    return tuple(order)


def _varies_with_arch(answers: BakeAnswers, arches: tuple[str, ...], name: str) -> bool:
    tags = {answers.get(a, False).targets[name].tags for a in arches}
    if len(arches) > 1:
        return len(tags) > 1
    return any(arches[0] in tag for tag in next(iter(tags)))


def _test_targets(
    outline: Outline, raw: Any, deps: Mapping[str, tuple[str, ...]]
) -> dict[str, str]:
    """Test targets -> the one target each tests (its only dependency)."""
    if raw is None:
        return {}
    line = outline.line(TEST_TARGETS_ATTR)
    if not isinstance(raw, list):
        raise BakeError(
            f"{TEST_TARGETS_ATTR} must be a list of target names", path=outline.path, line=line
        )
    tests = {}
    for name in raw:
        if not isinstance(name, str):
            raise BakeError(
                f"{TEST_TARGETS_ATTR} must be a list of target names", path=outline.path, line=line
            )
        if name not in deps:
            raise BakeError(
                f"{TEST_TARGETS_ATTR}: no target named {quote(name)}", path=outline.path, line=line
            )
        if len(deps[name]) != 1:
            raise BakeError(
                f"{TEST_TARGETS_ATTR}: {name!r} must take exactly one target's image, not "
                f"{list(deps[name]) or 'none'}",
                path=outline.path,
            )
        tests[name] = deps[name][0]
    return tests


def _check_dagster_names(graph: BakeGraph, first: ResolvedBake) -> None:
    """Refuse targets and groups that would make a name the code location cannot use."""
    assets = {t: first.targets[t].line for t in graph.asset_targets}
    tests = {t: first.targets[t].line for t in graph.test_targets}
    groups = {g: first.group_lines.get(g, 0) for g in graph.groups}
    grouped = {t for members in graph.groups.values() for t in members}
    problems = dagster_problems(assets, tests, groups, set(assets) - grouped)
    if problems:
        message, line = problems[0]
        raise BakeError(message, path=graph.path, line=line or None)


def load_graph(path: str | Path, env: Mapping[str, str] | None = None) -> BakeGraph:
    """Read a bake file, ask bake for its answer and check it into a BakeGraph; any problem is one
    BakeError line. `env` is bake's environment (default: os.environ)."""
    env = os.environ if env is None else env
    with boundary(Path(path)):
        try:
            outline = read_outline(path, env)
        except UnreadableSyntax as exc:
            # Bake's error names the problem best; if bake accepts the line, say python-hcl2 cannot.
            buildx = find_buildx(env)
            if buildx is None:
                raise
            bake_verdict(buildx, Path(path), env)
            raise BakeError(
                f"{exc.message} (docker buildx accepts it, but python-hcl2, which rocm-assets reads "
                "the file's names and lines with, does not: write the line another way)",
                path=exc.path,
                line=exc.line,
            ) from None
    return BakeGraph.from_outline(outline, env)
