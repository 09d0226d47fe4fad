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

from rocm_assets.core.bake import blocks
from rocm_assets.core.bake.errors import BakeError, NeedsBuildx, boundary
from rocm_assets.core.bake.evaluate import Evaluation
from rocm_assets.core.bake.limits import MAX_DEPTH, Budget, quote
from rocm_assets.core.bake.parse import BakeFile
from rocm_assets.core.bake.printed import PrintShapeError, cache_entry, canonical, output_entry
from rocm_assets.core.bake.values import to_string

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


def _string(value: Any, what: str, ev: Evaluation, line: int) -> str:
    try:
        return to_string(value)
    except ValueError as exc:
        raise ev.error(f"{what}: {exc}", line=line) from None


def _strings(value: Any, what: str, ev: Evaluation, line: int) -> list[str]:
    if not isinstance(value, list):
        raise ev.error(f"{what} must be a list", line=line)
    return [_string(v, what, ev, line) for v in value]


def _string_map(value: Any, what: str, ev: Evaluation, line: int) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ev.error(f"{what} must be an object", line=line)
    # Bake drops null args so the Dockerfile's own default applies.
    return {k: _string(v, what, ev, line) for k, v in value.items() if v is not None}


def _bool(value: Any, what: str, ev: Evaluation, line: int) -> bool:
    if not isinstance(value, bool):
        raise ev.error(f"{what} must be a bool", line=line)
    return value


def _objects(value: Any, what: str, ev: Evaluation, line: int, parse: Any) -> list[dict]:
    try:
        return [parse(text) for text in _strings(value, what, ev, line)]
    except PrintShapeError as exc:
        raise ev.error(f"{what}: {exc}", line=line) from None


# How the builtin resolver writes each attribute it reads into --print's shape. Attributes not
# here (secret, ssh, attest, resources, policy) it refuses: bake's parsing of them moves with
# each buildx release.
_WRITERS: dict[str, Any] = {
    "description": _string, "context": _string, "dockerfile": _string,
    "dockerfile-inline": _string, "target": _string, "network": _string, "shm-size": _string,
    "call": _string,
    "annotations": _strings, "tags": _strings, "platforms": _strings, "no-cache-filter": _strings,
    "ulimits": _strings, "entitlements": _strings,
    "args": _string_map, "labels": _string_map, "contexts": _string_map, "extra-hosts": _string_map,
    "pull": _bool, "no-cache": _bool,
    "cache-from": lambda v, w, e, n: _objects(v, w, e, n, cache_entry),
    "cache-to": lambda v, w, e, n: _objects(v, w, e, n, cache_entry),
    "output": lambda v, w, e, n: _objects(v, w, e, n, output_entry),
}  # fmt: skip
_NOT_WRITTEN = frozenset({"inherits"})


def builtin_entry(ev: Evaluation, name: str, attrs: Mapping[str, Any], line: int) -> dict:
    """A target's evaluated attributes written as bake's --print writes them."""
    entry: dict[str, Any] = {"context": ".", "dockerfile": "Dockerfile"}
    for attr, value in attrs.items():
        if attr in _NOT_WRITTEN or value is None:
            continue
        writer = _WRITERS.get(attr)
        if writer is None:
            raise NeedsBuildx(
                f"target {quote(name)}: attribute {quote(attr)}", path=ev.bake.path, line=line
            )
        entry[attr] = writer(value, f"target {quote(name)}: {attr}", ev, line)
    return canonical(entry)


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


def resolve(bake: BakeFile, env: Mapping[str, str], budget: Budget | None = None) -> ResolvedBake:
    """Evaluate a parsed bake file under `env` into targets and groups.

    `budget` bounds the work; a graph shares one across its evaluations.
    """
    with boundary(bake.path):
        return _resolve(Evaluation(bake, dict(env), budget))


def _resolve(ev: Evaluation) -> ResolvedBake:
    values = {name: ev.value(name) for name in ev.names()}
    ev.validate()
    targets: dict[str, Target] = {}
    for name, parts in ev.expansion.targets.items():
        line = parts[0].block.line
        targets[name] = Target(name, line, builtin_entry(ev, name, blocks.target(ev, name), line))
        check_tags(targets[name], ev.bake.path)
    groups = {name: tuple(blocks.group(ev, name)) for name in blocks.group_names(ev)}
    lines = {name: blocks.group_line(ev, name) for name in groups}
    return ResolvedBake(ev.bake.path, dict(ev.env), values, targets, groups, lines)
