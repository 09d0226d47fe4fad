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

from rocm_assets.core.bake.buildx import ALL_GROUP, VALUES_TARGET, bake_verdict
from rocm_assets.core.bake.errors import BakeError, boundary
from rocm_assets.core.bake.limits import MAX_ARCHES
from rocm_assets.core.bake.manifest import PrintKey, print_key
from rocm_assets.core.bake.resolvers import Resolver, choose
from rocm_assets.core.bake.source import Outline, UnreadableSyntax, read_outline
from rocm_assets.core.bake.targets import ResolvedBake, Target, answer
from rocm_assets.core.common.buildx import find_buildx
from rocm_assets.core.common.constants import (
    ARCH_LIST_ATTR,
    ARCH_VAR,
    PUBLISHED_INPUTS_VAR,
    TEST_TARGETS_ATTR,
)
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
    """

    def __init__(self, outline: Outline, env: Mapping[str, str] | None = None):
        self.outline = outline
        self.path = outline.path
        # Like bake, variables come from the environment (REGISTRY, SDE_*, ...); the arch and
        # the input mode are set per evaluation instead.
        source = os.environ if env is None else env
        self.base_env = {
            k: v for k, v in source.items() if k not in (ARCH_VAR, PUBLISHED_INPUTS_VAR)
        }
        self._cache: dict[tuple[str, bool], ResolvedBake] = {}
        # Bake's JSON for each call made, by (GPU_ARCH or "", PUBLISHED_INPUTS): the manifest.
        self.prints: dict[PrintKey, dict[str, Any]] = {}
        with boundary(self.path):
            for reserved in (VALUES_TARGET, ALL_GROUP):
                if reserved in outline.targets or reserved in outline.groups:
                    raise BakeError(
                        f"{quote(reserved)} is the name rocm-assets asks bake for its values "
                        "under: rename the block",
                        path=self.path,
                        line=outline.targets[reserved][0].line
                        if reserved in outline.targets
                        else outline.groups[reserved],
                    )
            self.resolver: Resolver = choose(outline, source)
            self._load()

    def _load(self) -> None:
        # The file's own default arch first: bake's values say which arches there are.
        (first,) = self._call([self._env(None, published=False)])
        self.arches: tuple[str, ...] = self._arches(first.values.get(ARCH_LIST_ATTR))
        default = first.values.get(ARCH_VAR)
        self._default_arch = default if isinstance(default, str) and default else None
        if self._default_arch is not None and self._default_arch not in self.arches:
            raise BakeError(
                f"{ARCH_VAR}'s default {quote(self._default_arch)} is not one of {ARCH_LIST_ATTR} "
                f"({', '.join(self.arches)})",
                path=self.path,
                line=self.outline.line(ARCH_VAR),
            )
        self._cache[self._key(None, False)] = first
        # Every other arch at once: bake runs once per arch, concurrently.
        self.prefetch(published=False)
        self.targets: tuple[str, ...] = ()
        names = list(first.targets)
        deps: dict[str, set[str]] = {n: set() for n in names}
        for arch in self.arches:
            resolved = self.resolve(arch)
            for name in names:
                deps[name] |= self._edges(resolved, resolved.targets[name])
        self.deps: dict[str, tuple[str, ...]] = {n: tuple(sorted(d)) for n, d in deps.items()}
        self.targets = self._topological(names)
        self.per_arch = frozenset(n for n in names if self._varies_with_arch(n))
        # In the file's order (bake prints them sorted): `default`, then as written.
        order = {g: i for i, g in enumerate(self.outline.groups)}
        named = sorted(first.groups, key=lambda g: (g != "default", order.get(g, len(order)), g))
        self.groups: dict[str, tuple[str, ...]] = {g: first.expand([g]) for g in named}
        self.test_targets = self._test_targets(first.values.get(TEST_TARGETS_ATTR))
        self._check_dagster_names(first)

    @property
    def default_arch(self) -> str:
        """The arch bake resolves for when GPU_ARCH is unset: the file's default."""
        return self._default_arch or self.arches[0]

    @property
    def resolver_version(self) -> str:
        """The buildx version that answered: this host's, or the manifest's writer's."""
        return self.resolver.version_text

    @property
    def resolver_label(self) -> str:
        return self.resolver.label

    def _arches(self, raw: Any) -> tuple[str, ...]:
        line = self.outline.line(ARCH_LIST_ATTR)
        if not isinstance(raw, list) or not raw or not all(isinstance(a, str) and a for a in raw):
            raise BakeError(
                f"{ARCH_LIST_ATTR} must be a non-empty list of GPU arch names",
                path=self.path,
                line=line,
            )
        arches = tuple(dict.fromkeys(raw))
        if len(arches) > MAX_ARCHES:
            raise BakeError(
                f"{ARCH_LIST_ATTR} has {len(arches)} arches, over the limit of {MAX_ARCHES}",
                path=self.path,
                line=line,
            )
        for arch in arches:
            problem = arch_problem(arch)
            if problem:
                raise BakeError(f"{ARCH_LIST_ATTR}: {problem}", path=self.path, line=line)
        return arches

    def _check_dagster_names(self, first: ResolvedBake) -> None:
        assets = {t: first.targets[t].line for t in self.asset_targets}
        tests = {t: first.targets[t].line for t in self.test_targets}
        groups = {g: first.group_lines.get(g, 0) for g in self.groups}
        grouped = {t for members in self.groups.values() for t in members}
        problems = dagster_problems(assets, tests, groups, set(assets) - grouped)
        if problems:
            message, line = problems[0]
            raise BakeError(message, path=self.path, line=line or None)

    def _test_targets(self, raw: Any) -> dict[str, str]:
        """Test targets -> the one target each tests (its only dependency)."""
        if raw is None:
            return {}
        if not isinstance(raw, list):
            raise BakeError(
                f"{TEST_TARGETS_ATTR} must be a list of target names",
                path=self.path,
                line=self.outline.line(TEST_TARGETS_ATTR),
            )
        tests = {}
        line = self.outline.line(TEST_TARGETS_ATTR)
        for name in raw:
            if not isinstance(name, str):
                raise BakeError(
                    f"{TEST_TARGETS_ATTR} must be a list of target names", path=self.path, line=line
                )
            if name not in self.deps:
                raise BakeError(
                    f"{TEST_TARGETS_ATTR}: no target named {quote(name)}", path=self.path, line=line
                )
            if len(self.deps[name]) != 1:
                raise BakeError(
                    f"{TEST_TARGETS_ATTR}: {name!r} must take exactly one target's image, not "
                    f"{list(self.deps[name]) or 'none'}",
                    path=self.path,
                )
            tests[name] = self.deps[name][0]
        return tests

    @property
    def asset_targets(self) -> tuple[str, ...]:
        """Targets that publish an image: every buildable target but the test targets."""
        return tuple(t for t in self.targets if t not in self.test_targets)

    # ---- evaluation ----
    def _env(self, arch: str | None, *, published: bool) -> dict[str, str]:
        env = {**self.base_env, PUBLISHED_INPUTS_VAR: "1" if published else "0"}
        if arch:
            env[ARCH_VAR] = arch
        return env

    def _key(self, arch: str | None, published: bool) -> tuple[str, bool]:
        # The file's default arch is also a named arch: resolve it once, not twice.
        return (arch or self._default_arch or "", published)

    def prefetch(self, *, published: bool) -> None:
        """Resolve the default and every arch in one input mode, in one batch."""
        self._resolve_all([None, *self.arches], published)

    def _resolve_all(self, arches: list[str | None], published: bool) -> None:
        wanted: dict[tuple[str, bool], str | None] = {}
        for arch in arches:
            if arch and arch not in self.arches:
                raise BakeError(
                    f"{ARCH_VAR}={arch} is not one of {ARCH_LIST_ATTR} ({', '.join(self.arches)})",
                    path=self.path,
                    line=self.outline.line(ARCH_LIST_ATTR),
                )
            key = self._key(arch, published)
            if key not in self._cache:
                wanted.setdefault(key, arch or self._default_arch)
        if not wanted:
            return
        envs = [self._env(arch, published=published) for arch in wanted.values()]
        for key, resolved in zip(wanted, self._call(envs), strict=True):
            self._cache[key] = resolved
            first = next(iter(self._cache.values()))
            if resolved.targets.keys() != first.targets.keys():
                changed = sorted(resolved.targets.keys() ^ first.targets.keys())
                raise BakeError(
                    f"the targets differ between evaluations ({', '.join(map(quote, changed[:3]))}"
                    f"{' ...' if len(changed) > 3 else ''} with {ARCH_VAR}={key[0] or 'default'}, "
                    f"{PUBLISHED_INPUTS_VAR}={int(published)}): a matrix or name must not depend on them",
                    path=self.path,
                )

    def _call(self, envs: list[dict[str, str]]) -> list[ResolvedBake]:
        """Bake's answer for each environment, read into targets, groups and values."""
        out = []
        for env, data in zip(envs, self.resolver.prints(envs), strict=True):
            self.prints[print_key(env)] = data
            with boundary(self.path):
                out.append(answer(self.outline, env, data, self.resolver.version))
        return out

    def resolve(self, arch: str | None, *, published: bool = False) -> ResolvedBake:
        """The file resolved for one arch (default: the bake file's own default) and input mode."""
        key = self._key(arch, published)
        if key not in self._cache:
            self._resolve_all([arch], published)
        return self._cache[key]

    def _edges(self, resolved: ResolvedBake, target: Target) -> set[str]:
        edges = set()
        for context, linked in target.target_links.items():
            if linked not in resolved.targets:
                raise BakeError(
                    f"target {target.name!r}: context {context!r} links target:{linked}, but there is "
                    f"no target named {linked!r}",
                    path=self.path,
                    line=target.line,
                )
            if linked.startswith("_"):
                raise BakeError(
                    f"target {target.name!r}: context {context!r} links private target {linked!r}",
                    path=self.path,
                    line=target.line,
                )
            edges.add(linked)
        for ref in target.image_contexts.values():
            owner = resolved.tag_owner(ref)
            if owner and owner != target.name and not owner.startswith("_"):
                edges.add(owner)
        return edges

    def _varies_with_arch(self, name: str) -> bool:
        tags = {self.resolve(a).targets[name].tags for a in self.arches}
        if len(self.arches) > 1:
            return len(tags) > 1
        return any(self.arches[0] in tag for tag in next(iter(tags)))

    def _topological(self, names: list[str]) -> tuple[str, ...]:
        """Dependencies first; iterative, so a long chain of targets cannot overflow the stack."""
        order: list[str] = []
        state: dict[str, int] = {}
        for root in names:
            if state.get(root):
                continue
            path: list[str] = [root]
            pending: list[list[str]] = [list(self.deps[root])]
            state[root] = 1
            while path:
                if pending[-1]:
                    dep = pending[-1].pop(0)
                    if state.get(dep) == 1:
                        cycle = [*path[path.index(dep) :], dep]
                        raise BakeError(f"dependency cycle: {' -> '.join(cycle)}", path=self.path)
                    if not state.get(dep):
                        state[dep] = 1
                        path.append(dep)
                        pending.append(list(self.deps[dep]))
                else:
                    done = path.pop()
                    pending.pop()
                    state[done] = 2
                    order.append(done)
        return tuple(order)

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
    return BakeGraph(outline, env)
