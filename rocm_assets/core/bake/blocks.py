"""Target and group blocks as bake resolves them: matrix expansion, merging, `inherits`.

A target block with `matrix = {k = [...]}` and `name = "..."` becomes one target per
combination of the matrix values, named by `name` (evaluated with the combination in scope); its
label then names a group of those targets, as bake's ParseMeta.Renamed does. Blocks that end up
with the same name merge attribute by attribute, later blocks winning, as in bake.
"""

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rocm_assets.core.bake.limits import MAX_COLLECTION, check_length, quote
from rocm_assets.core.bake.names import label_problem
from rocm_assets.core.bake.parse import Block
from rocm_assets.core.bake.values import to_string, type_name

if TYPE_CHECKING:
    from rocm_assets.core.bake.evaluate import Evaluation

Value = Any

# Bake's Target.Merge: these keys merge by key across `inherits`; the rest are replaced.
_MERGED_KEYS = frozenset({"args", "labels", "contexts", "annotations", "extra-hosts"})
# Attributes that shape the expansion rather than the target.
_META_KEYS = frozenset({"matrix", "name"})


@dataclass(frozen=True)
class TargetPart:
    """One block's share of a target, with its matrix combination in scope."""

    block: Block
    scope: dict[str, Value]


@dataclass(frozen=True)
class Expansion:
    """Every target name with its parts, and the groups matrix labels became."""

    targets: dict[str, list[TargetPart]]
    groups: dict[str, tuple[list[str], int]]


def expand(ev: "Evaluation") -> Expansion:
    targets: dict[str, list[TargetPart]] = {}
    renamed: dict[str, tuple[list[str], int]] = {}
    for label, blocks in ev.bake.targets.items():
        for block in blocks:
            if "name" in block.attrs and "matrix" not in block.attrs:
                raise ev.error(f"target {quote(label)}: name requires matrix", block.attrs["name"])
            if "matrix" not in block.attrs:
                targets.setdefault(label, []).append(TargetPart(block, {}))
                continue
            names: list[str] = []
            for scope in _combinations(ev, block):
                name = _name(ev, block, scope)
                if name in names:
                    raise ev.error(
                        f"target {quote(label)}: the matrix names two targets {quote(name)}",
                        block.attrs.get("name") or block.attrs["matrix"],
                    )
                names.append(name)
                targets.setdefault(name, []).append(TargetPart(block, scope))
            if names != [label]:
                members, _ = renamed.setdefault(label, ([], block.line))
                members.extend(n for n in names if n not in members)
    for label, (_, line) in renamed.items():
        if label in ev.bake.groups:
            raise ev.error(
                f"matrix target {quote(label)} becomes a group, but a group block has that name",
                line=line,
            )
    return Expansion(targets, renamed)


def _combinations(ev: "Evaluation", block: Block) -> list[dict[str, Value]]:
    rule = block.attrs["matrix"]
    matrix = ev.expr(rule.expression, {})
    if not isinstance(matrix, dict):
        raise ev.error(
            f"target {quote(block.name)}: matrix must be an object, not a {type_name(matrix)}", rule
        )
    keys = sorted(matrix)
    for key in keys:
        if not isinstance(matrix[key], list):
            raise ev.error(
                f"target {quote(block.name)}: matrix values must be lists ({quote(key)} is not)",
                rule,
            )
    count = 1
    with ev.limits(rule):
        for key in keys:
            count *= len(matrix[key])
            check_length(count, f"target {quote(block.name)}'s matrix", MAX_COLLECTION, "targets")
        ev.budget.spend(count)
    return [
        dict(zip(keys, combo, strict=True))
        for combo in itertools.product(*(matrix[k] for k in keys))
    ]


def _name(ev: "Evaluation", block: Block, scope: dict[str, Value]) -> str:
    rule = block.attrs.get("name")
    if rule is None:
        return block.name
    value = ev.expr(rule.expression, scope)
    try:
        name = to_string(value)
    except ValueError as exc:
        raise ev.error(f"target {quote(block.name)}: name: {exc}", rule) from None
    problem = label_problem("target", name)
    if problem:
        raise ev.error(f"matrix target {quote(block.name)}: {problem}", rule)
    return name


def target(ev: "Evaluation", name: str, chain: tuple[str, ...] = ()) -> dict[str, Value]:
    """A target's attributes after `inherits`, merged as bake's Target.Merge does."""
    parts = ev.expansion.targets.get(name)
    if not parts:
        where = f" (inherited by {quote(chain[-1])})" if chain else ""
        raise ev.error(f"no target named {quote(name)}{where}")
    if name in chain:
        raise ev.error(f"inherits cycle: {' -> '.join([*chain, name])}", line=parts[0].block.line)
    own: dict[str, Value] = {}
    for part in parts:
        for attr, rule in part.block.attrs.items():
            if attr not in _META_KEYS:
                _merge(own, attr, ev.expr(rule.expression, part.scope))
    merged: dict[str, Value] = {}
    inherits = own.pop("inherits", None) or []
    if not isinstance(inherits, list):
        raise ev.error(f"target {quote(name)}: inherits must be a list", line=parts[0].block.line)
    with ev.nested(line=parts[0].block.line):
        for parent in inherits:
            for attr, value in target(ev, to_string(parent), (*chain, name)).items():
                _merge(merged, attr, value)
    for attr, value in own.items():
        _merge(merged, attr, value)
    return merged


def _merge(into: dict[str, Value], attr: str, value: Value) -> None:
    if attr in _MERGED_KEYS and isinstance(value, dict) and isinstance(into.get(attr), dict):
        into[attr] = {**into[attr], **{k: v for k, v in value.items() if v is not None}}
    else:
        into[attr] = value


def target_attr(ev: "Evaluation", name: str, attr: str, rule: Any) -> Value:
    """`target.<name>.<attr>`: the attribute as written in that target's own blocks; null if unset.

    `target.<name>.name` is the name itself, as in bake.
    """
    parts = ev.expansion.targets.get(name)
    if not parts:
        raise ev.error(f"target.{name}.{attr}: no target named {quote(name)}", rule)
    if attr == "name":
        return name
    found = [p for p in parts if attr in p.block.attrs]
    if not found:
        return None
    part = found[-1]
    with ev.nested(rule):
        return ev.expr(part.block.attrs[attr].expression, part.scope)


def group(ev: "Evaluation", name: str) -> list[str]:
    """A group's members as written (targets or groups), matrix labels included."""
    if name in ev.expansion.groups:
        return list(ev.expansion.groups[name][0])
    members: list[str] = []
    for block in ev.bake.groups[name]:
        rule = block.attrs.get("targets")
        value = ev.expr(rule.expression, {}) if rule else []
        if not isinstance(value, list):
            raise ev.error(f"group {quote(name)}: targets must be a list", rule)
        members.extend(to_string(v) for v in value)
    return members


def group_names(ev: "Evaluation") -> list[str]:
    return [*ev.bake.groups, *ev.expansion.groups]


def group_line(ev: "Evaluation", name: str) -> int:
    if name in ev.expansion.groups:
        return ev.expansion.groups[name][1]
    return ev.bake.groups[name][0].line
