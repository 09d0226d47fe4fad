"""Resolved bake targets: what `docker buildx bake --print` says of each, whichever resolver
answered, and the builtin resolver that answers without buildx.

A `Target` is a view over its --print entry (`printed`), so the graph, `rocm-assets graph --json`
and the differential tests read one shape. The builtin resolver writes its evaluation into that
shape, and refuses (`NeedsBuildx`) what it cannot write exactly as bake would.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocm_assets.core.bake import blocks, calls, fields
from rocm_assets.core.bake.errors import BakeError, Unfollowed, boundary
from rocm_assets.core.bake.evaluate import Evaluation
from rocm_assets.core.bake.features import minimum
from rocm_assets.core.bake.limits import MAX_DEPTH, Budget, quote
from rocm_assets.core.bake.parse import BakeFile

TARGET_PREFIX = "target:"
IMAGE_PREFIX = "docker-image://"
# An image reference as Docker's reference grammar reads it: [host[:port]/]path[:tag][@digest],
# path components lower case. A tag bake would refuse (e.g. `reg/app:` from an empty variable)
# is refused here, with its target and line, before any build or registry lookup uses it.
_REFERENCE = re.compile(
    r"(?:(?:[a-zA-Z0-9.-]+|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?"
)


def builtin_entry(ev: Evaluation, name: str) -> dict:
    """A target as the builtin resolver resolves it, written as bake's --print writes it."""
    resolved = blocks.target(ev, name)
    assert resolved is not None  # a target met first is never skipped
    return fields.entry(resolved)


@dataclass(frozen=True, slots=True)
class Target:
    """One bake target as bake resolves it: its --print entry, and the line that declares it."""

    name: str
    line: int | None
    printed: Mapping[str, Any]

    @property
    def dockerfile(self) -> str:
        return self.printed.get("dockerfile", "Dockerfile")

    @property
    def context(self) -> str:
        return self.printed.get("context", ".")

    @property
    def stage(self) -> str | None:
        return self.printed.get("target")

    @property
    def description(self) -> str:
        return self.printed.get("description", "")

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(self.printed.get("tags", ()))

    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(self.printed.get("platforms", ()))

    @property
    def args(self) -> Mapping[str, str]:
        return self.printed.get("args", {})

    @property
    def contexts(self) -> Mapping[str, str]:
        return self.printed.get("contexts", {})

    @property
    def target_links(self) -> dict[str, str]:
        """Named contexts that link another bake target: context name -> target name."""
        return {
            k: v.removeprefix(TARGET_PREFIX)
            for k, v in self.contexts.items()
            if v.startswith(TARGET_PREFIX)
        }

    @property
    def image_contexts(self) -> dict[str, str]:
        """Named contexts resolved from a registry: context name -> image reference."""
        return {
            k: v.removeprefix(IMAGE_PREFIX)
            for k, v in self.contexts.items()
            if v.startswith(IMAGE_PREFIX)
        }


def check_tags(target: Target, path: Path) -> None:
    """Every tag a valid image reference, checked before any build or registry lookup uses it."""
    for tag in target.tags:
        if not _REFERENCE.fullmatch(tag) or len(tag) > 255:
            raise BakeError(
                f"target {quote(target.name)}: tags: {quote(tag)} is not a valid image reference",
                path=path,
                line=target.line,
            )


@dataclass(frozen=True)
class ResolvedBake:
    """Every target and group of a bake file for one environment."""

    path: Path
    env: Mapping[str, str]
    values: Mapping[str, Any]
    targets: Mapping[str, Target]
    groups: Mapping[str, tuple[str, ...]]
    group_lines: Mapping[str, int] = field(default_factory=dict)

    def expand(self, names: Iterable[str]) -> tuple[str, ...]:
        """Group and target names to target names, in first-seen order; groups win, as in bake."""
        out: dict[str, None] = {}

        def visit(name: str, chain: tuple[str, ...]) -> None:
            if name in chain:
                raise BakeError(f"group cycle: {' -> '.join([*chain, name])}", path=self.path)
            if len(chain) > MAX_DEPTH:
                raise BakeError(
                    f"groups nest deeper than the limit of {MAX_DEPTH}",
                    path=self.path,
                    line=self.group_lines.get(chain[0]),
                )
            if name in self.groups:
                for member in self.groups[name]:
                    visit(member, (*chain, name))
            elif name in self.targets:
                out[name] = None
            else:
                where = f" (in group {quote(chain[-1])})" if chain else ""
                raise BakeError(
                    f"no target or group named {quote(name)}{where}",
                    path=self.path,
                    line=self.group_lines.get(chain[-1]) if chain else None,
                )

        for name in names:
            visit(name, ())
        return tuple(out)

    def tag_owner(self, ref: str) -> str | None:
        return next((t.name for t in self.targets.values() if ref in t.tags), None)


def resolve(
    bake: BakeFile,
    env: Mapping[str, str],
    budget: Budget | None = None,
    *,
    version: tuple[int, int, int] | None = None,
) -> ResolvedBake:
    """Evaluate a parsed bake file under `env` into targets and groups, as bake would.

    `budget` bounds the work; a graph shares one across its evaluations. With `version`, a
    file that needs a newer buildx (see `features`) fails as that bake would fail it.
    """
    with boundary(bake.path):
        if version is not None:
            needs = minimum(bake)
            if needs is not None and needs.version > version:
                raise BakeError(
                    f"{needs}: bake {'.'.join(map(str, version))} refuses this file",
                    path=bake.path,
                    line=needs.line,
                )
        ev = Evaluation(bake, dict(env), budget)
        try:
            return _resolve(ev)
        except Unfollowed as exc:
            raise ev.refusal(exc) from None


def _check_links(
    ev: Evaluation, targets: Mapping[str, Target], failed: Mapping[str, BakeError]
) -> None:
    """Bake's loadLinks over every public target: a `target:` link to itself, a loop, a missing
    or failed target, or platforms the linked target does not build, fails the file."""

    def visit(name: str, visited: tuple[str, ...]) -> None:
        if name in failed:
            raise failed[name]
        if name not in targets:
            raise ev.error(f"failed to find target {quote(name)}")
        target = targets[name]
        for linked in target.target_links.values():
            if linked == name:
                raise ev.error(f"target {quote(name)} cannot link to itself")
            if linked in visited:
                raise ev.error(f"infinite loop from {quote(name)} to {quote(linked)}")
            visit(linked, (*visited, name))
            mine = list(target.printed.get("platforms", ()))
            theirs = list(targets[linked].printed.get("platforms", ()))
            if len(mine) > 1 and len(theirs) > 1 and mine != theirs:
                if not set(mine) <= set(theirs):
                    raise ev.error(
                        f"target {quote(linked)} can't be used by {quote(name)}: platforms differ"
                    )
                # 0.13.1 wants the same list, 0.29 a subset.
                raise Unfollowed("a linked target that builds more platforms")

    for name in targets:
        if not name.startswith("_"):
            visit(name, ())


def _resolve(ev: Evaluation) -> ResolvedBake:
    values = {name: ev.value(name) for name in ev.names()}
    ev.validate()
    calls.check_functions(ev)
    targets: dict[str, Target] = {}
    # Bake evaluates every block, but resolves (inherits, links) only the targets it is asked
    # for and what they use: a private target that fails there fails only where it is used.
    failed: dict[str, BakeError] = {}
    for name, parts in ev.expansion.targets.items():
        blocks.own(ev, name)
        line = parts[0].block.line
        try:
            targets[name] = Target(name, line, builtin_entry(ev, name))
        except BakeError as exc:
            if not name.startswith("_"):
                raise
            failed[name] = exc
    _check_links(ev, targets, failed)
    groups = {name: tuple(blocks.group(ev, name)) for name in blocks.group_names(ev)}
    lines = {name: blocks.group_line(ev, name) for name in groups}
    return ResolvedBake(ev.bake.path, dict(ev.env), values, targets, groups, lines)
