"""Resolved bake targets: bake's `--print` answer for one environment, as the graph reads it.

A `Target` is a view over its --print entry (`printed`, in `printed.canonical`'s shape), so the
graph and `rocm-assets graph --json` read one shape, whichever buildx printed it. `resolved_bake`
turns one print (from bake now, or from a manifest bake wrote) into targets, groups and values.
"""

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.limits import MAX_DEPTH
from rocm_assets.core.bake.printed import PrintShapeError, canonical
from rocm_assets.core.bake.probe import ALL_GROUP, VALUES_TARGET, requested
from rocm_assets.core.bake.source import Outline
from rocm_assets.core.common.text import quote

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


def _entry(outline: Outline, name: str, entry: Any, version: tuple[int, ...]) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise BakeError(
            f"docker buildx bake --print: target {quote(name)} is not an object", path=outline.path
        )
    try:
        return canonical(entry, version=version)
    except PrintShapeError as exc:
        raise BakeError(
            f"docker buildx bake --print: target {quote(name)}: {exc}", path=outline.path
        ) from None


def _values(outline: Outline, printed: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level values, as bake's jsonencode wrote them into the probe target's args."""
    args = printed.get("args", {})
    values = {}
    for name in outline.top_level_names:
        try:
            values[name] = json.loads(args[name])
        except (KeyError, TypeError, ValueError):
            raise BakeError(
                f"docker buildx bake --print gave no value for {quote(name)}",
                path=outline.path,
                line=outline.line(name),
            ) from None
    return values


def resolved_bake(
    outline: Outline, env: Mapping[str, str], data: Mapping[str, Any], version: tuple[int, ...]
) -> ResolvedBake:
    """One `--print` of the probe group (`probe.probe_text`) as targets, groups and values."""
    raw = data.get("target") or {}
    if VALUES_TARGET not in raw:
        raise BakeError(
            "docker buildx bake --print left out rocm-assets' values target", path=outline.path
        )
    values = _values(outline, _entry(outline, VALUES_TARGET, raw[VALUES_TARGET], version))
    # Each group as written; `default` also lists what was asked for (an empty group there adds
    # no target), and is the file's only if the file declares one.
    asked = set(requested(outline))
    groups: dict[str, tuple[str, ...]] = {}
    for name, group in (data.get("group") or {}).items():
        if name == ALL_GROUP or (name == "default" and name not in outline.groups):
            continue
        members = group.get("targets") if isinstance(group, dict) else None
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise BakeError(
                f"docker buildx bake --print: group {quote(name)} has no target list",
                path=outline.path,
            )
        groups[name] = tuple(m for m in members if not (name == "default" and m in asked))
    # A matrix target's line is its block's: the group its label became names it.
    made = {
        member: label for label in groups if label in outline.targets for member in groups[label]
    }
    found = []
    for name, entry in raw.items():
        if name == VALUES_TARGET or name.startswith("_"):
            continue
        label = name if name in outline.targets else made.get(name)
        line = outline.targets[label][0].line if label else None
        target = Target(name, line, _entry(outline, name, entry, version))
        check_tags(target, outline.path)
        found.append(target)
    # In the file's order (bake prints them sorted).
    found.sort(key=lambda t: t.line or 1 << 30)
    lines = {
        g: outline.groups.get(g) or outline.targets[g][0].line
        for g in groups
        if g in outline.groups or g in outline.targets
    }
    return ResolvedBake(outline.path, dict(env), values, {t.name: t for t in found}, groups, lines)
