"""Target and group blocks as bake resolves them: matrix expansion, merging, `inherits`.

A target block with `matrix = {k = [...]}` and `name = "..."` becomes one target per
combination of the matrix values, named by `name` (evaluated with the combination in scope); its
label then names a group of those targets, as bake's ParseMeta.Renamed does (no group when the
matrix makes no target). Each block is decoded into bake's Target fields (`fields`), and blocks
and inherited targets merge as bake's Target.Merge does: some fields replace, some append, maps
merge by key; each resolved target is then normalised (lists deduplicated, empty contexts
dropped). A cycle in `inherits` is skipped, as bake skips it.
"""

import itertools
from typing import Any

from rocm_assets.core.bake import fields
from rocm_assets.core.bake.errors import Unfollowed
from rocm_assets.core.bake.evaluator import Evaluator, Expansion, TargetPart
from rocm_assets.core.bake.limits import MAX_COLLECTION, check_length, quote
from rocm_assets.core.bake.names import label_problem
from rocm_assets.core.bake.parse import Block
from rocm_assets.core.bake.values import to_string, type_name

Value = Any


def expand(ev: Evaluator) -> Expansion:
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
            if names and names != [label]:
                members, _ = renamed.setdefault(label, ([], block.line))
                members.extend(n for n in names if n not in members)
    for label in renamed:
        if label in ev.bake.groups:
            raise Unfollowed(f"matrix target {label!r} and a group block share a name")
    return Expansion(targets, renamed)


def _combinations(ev: Evaluator, block: Block) -> list[dict[str, Value]]:
    rule = block.attrs["matrix"]
    matrix = ev.expr(rule.expression, {})
    if not isinstance(matrix, dict):
        raise ev.error(
            f"target {quote(block.name)}: matrix must be a map, not a {type_name(matrix)}", rule
        )
    keys = sorted(matrix)
    for key in keys:
        if isinstance(matrix[key], dict):
            raise Unfollowed(f"target {block.name!r}: a matrix over an object's values")
        if not isinstance(matrix[key], list):
            raise ev.error(
                f"target {quote(block.name)}: matrix values must be a list ({quote(key)} is not)",
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


def _name(ev: Evaluator, block: Block, scope: dict[str, Value]) -> str:
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


def own(ev: Evaluator, name: str) -> dict[str, Value]:
    """A target's own blocks, decoded and merged in file order (its inherits list too)."""
    if name in ev.owned:
        return ev.owned[name]
    parts = ev.expansion.targets.get(name)
    if not parts:
        raise ev.error(f"failed to find target {quote(name)}")
    merged: dict[str, Value] = {}
    for part in parts:
        decoded: dict[str, Value] = {}
        for attr, rule in part.block.attrs.items():
            if attr in fields.KNOWN:
                value = ev.expr(rule.expression, part.scope)
                decoded[attr] = fields.decode(ev, name, attr, value, rule)
        fields.merge(merged, decoded)
    ev.owned[name] = merged
    return merged


def target(
    ev: Evaluator, name: str, visited: dict[str, dict[str, Value] | None] | None = None
) -> dict[str, Value] | None:
    """bake's Config.target: the parents merged, then the target's own fields, normalised.

    `visited` is one resolution's memo; a target met again while it resolves is skipped (None).
    """
    visited = {} if visited is None else visited
    if name in visited:
        return visited[name]
    visited[name] = None
    mine = own(ev, name)
    inherited: dict[str, Value] = {}
    with ev.nested(line=ev.expansion.targets[name][0].block.line):
        for parent in mine.get("inherits") or []:
            resolved = target(ev, parent, visited)
            if resolved is not None:
                fields.merge(inherited, resolved)
    result: dict[str, Value] = {}
    fields.merge(result, inherited)
    fields.merge(result, mine)
    fields.normalize(result)
    visited[name] = result
    return result


def target_attr(ev: Evaluator, name: str, attr: str, rule: Any) -> Value:
    """`target.<name>.<attr>`: the attribute as the target's block decodes it; null if unset."""
    parts = ev.expansion.targets.get(name)
    if not parts:
        raise ev.error(f"target.{name}.{attr}: no target named {quote(name)}", rule)
    if attr == "name":
        return name
    if len(parts) > 1:
        raise Unfollowed(f"target.{name}.{attr} of a target with several blocks")
    part = parts[0]
    if attr not in part.block.attrs:
        if attr not in fields.REFERABLE:
            raise Unfollowed(f"target.{name}.{attr}")
        return None
    with ev.nested(rule):
        value = ev.expr(part.block.attrs[attr].expression, part.scope)
    return fields.referable(ev, name, attr, value, part.block.attrs[attr])


def group(ev: Evaluator, name: str) -> list[str]:
    """A group's members as written (targets or groups), matrix labels included; the last
    block of a name is the group, as in bake."""
    if name in ev.expansion.groups:
        return list(ev.expansion.groups[name][0])
    block = ev.bake.groups[name][-1]
    rule = block.attrs.get("targets")
    value = ev.expr(rule.expression, {}) if rule else []
    if not isinstance(value, list):
        raise ev.error(f"group {quote(name)}: targets must be a list", rule)
    return list(dict.fromkeys(to_string(v) for v in value))


def group_names(ev: Evaluator) -> list[str]:
    return [*ev.bake.groups, *ev.expansion.groups]


def group_line(ev: Evaluator, name: str) -> int:
    if name in ev.expansion.groups:
        return ev.expansion.groups[name][1]
    return ev.bake.groups[name][0].line
