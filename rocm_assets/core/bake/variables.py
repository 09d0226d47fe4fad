"""Variable blocks as bake resolves them: defaults, types, env overrides and validation.

Follows buildx's `resolveValue` (bake/hclparser/hclparser.go): a top-level attribute of a
variable's name replaces its default (and its type); the environment overrides either, converted
by the type of the default (untyped) or the declared type (buildx >= 0.24) the way Go's strconv
reads it; an untyped variable without a default is the env value or "". Where buildx releases
read an override differently (`NAME_JSON`, 0.29's CSV lists, `any`), the resolver refuses.
"""

import math
import re
from typing import Any

from hcl2.rules import base as B

from rocm_assets.core.bake import ctynum
from rocm_assets.core.bake.ctynum import Num
from rocm_assets.core.bake.errors import Unfollowed
from rocm_assets.core.bake.evaluator import Evaluator
from rocm_assets.core.bake.features import names_used
from rocm_assets.core.bake.limits import quote
from rocm_assets.core.bake.parse import Block, line_of
from rocm_assets.core.bake.values import (
    PARSE_BOOL_FALSE,
    PARSE_BOOL_TRUE,
    text,
    to_bool,
    to_number,
    to_string,
)

Value = Any

# The declared types followed: a primitive, or a list of one.
_TYPES = {"string", "number", "bool"}
_LIST_TYPE = re.compile(r"list\((string|number|bool)\)")
# What Go's strconv.ParseFloat reads as a decimal (underscores between digits allowed).
_GO_DECIMAL = re.compile(
    r"[+-]?(?:\d+(?:_\d+)*(?:\.(?:\d+(?:_\d+)*)?)?|\.\d+(?:_\d+)*)(?:[eE][+-]?\d+(?:_\d+)*)?"
)
_GO_SPECIAL = re.compile(r"[+-]?(?:inf|infinity|nan)", re.IGNORECASE)


def declared_type(ev: Evaluator, block: Block) -> str | None:
    """The variable's `type`, as one of the followed forms; None when it has none."""
    rule = block.attrs.get("type")
    if rule is None:
        return None
    raw = rule.expression.serialize()
    kind = (raw[2:-1] if isinstance(raw, str) and raw.startswith("${") else str(raw)).strip()
    kind = re.sub(r"\s+", "", kind)
    if kind in _TYPES or _LIST_TYPE.fullmatch(kind):
        return kind
    raise Unfollowed(f"variable {block.name!r}: type {kind}")


def parse_float(name: str, raw: str) -> Num:
    """Go's strconv.ParseFloat(raw, 64), as bake reads a number from the environment."""
    if _GO_DECIMAL.fullmatch(raw):
        value = float(raw.replace("_", ""))
        if math.isinf(value):
            raise ValueError(f"failed to parse {name} as number: {quote(raw)}: value out of range")
        return ctynum.from_float(value)
    if _GO_SPECIAL.fullmatch(raw):
        raise ValueError(f"failed to parse {name} as number: invalid number value")
    if raw.lower().lstrip("+-").startswith("0x") and "p" in raw.lower():
        raise Unfollowed(f"a hexadecimal float in ${name}")
    raise ValueError(f"failed to parse {name} as number: {quote(raw)}: invalid syntax")


def _primitive(name: str, raw: str, kind: str) -> Value:
    """buildx's convertPrimitive: a string, strconv.ParseBool or strconv.ParseFloat."""
    if kind == "string":
        return text(raw)
    if kind == "bool":
        if raw in PARSE_BOOL_TRUE:
            return True
        if raw in PARSE_BOOL_FALSE:
            return False
        raise ValueError(f"failed to parse {name} as bool: {quote(raw)}: invalid syntax")
    return parse_float(name, raw)


def _csv(name: str, raw: str, element: str) -> list:
    """buildx 0.24+'s CSV list override (csvvalue.Fields, no quotes followed)."""
    if '"' in raw:
        raise Unfollowed(f"a quoted CSV override of ${name}")
    if raw == "":
        raise ValueError(f"failed to convert variable {name} from CSV: EOF")
    return [_primitive(name, field, element) for field in raw.split(",")]


def convert_to(value: Value, kind: str, name: str) -> Value:
    """A typed variable's default converted to its declared type (go-cty's convert)."""
    if value is None:
        return None
    if kind == "string":
        if isinstance(value, list | dict):
            raise ValueError(f"invalid type string for variable {name} default value")
        return to_string(value)
    if kind == "number":
        return to_number(value)
    if kind == "bool":
        return to_bool(value)
    if not isinstance(value, list):
        raise ValueError(f"invalid type {kind} for variable {name} default value")
    element = kind[5:-1]
    return [convert_to(v, element, name) for v in value]


# What a variable block may set: 0.29 ignores anything else where 0.13.1 refuses it.
_VARIABLE_ATTRIBUTES = frozenset({"default", "type", "description"})


def value(ev: Evaluator, block: Block) -> Value:
    name = block.name
    unknown = sorted(set(block.attrs) - _VARIABLE_ATTRIBUTES)
    if unknown:
        raise Unfollowed(f"variable {name!r}: attribute {unknown[0]!r} (buildx releases differ)")
    attr = ev.bake.attrs.get(name)
    # A top-level attribute of the same name replaces the default, and its type with it.
    kind = None if attr else declared_type(ev, block)
    default_rule = attr or block.attrs.get("default")
    json_name = f"{name}_JSON"
    if json_name in ev.env and json_name not in ev.bake.variables:
        raise Unfollowed(f"${json_name} (buildx 0.24+ reads it, older releases do not)")
    raw = ev.env.get(name)
    if default_rule is None:
        if kind is not None:
            if raw is None:
                # A null of the declared type: bake treats it apart from a plain null.
                raise Unfollowed(f"variable {name!r}: a typed variable without a value")
            return _typed_override(name, raw, kind)
        return text(raw) if raw is not None else ""
    default = ev.expr(default_rule.expression, {})
    if kind is not None:
        try:
            default = convert_to(default, kind, name)
        except ValueError as exc:
            raise ev.error(str(exc), default_rule) from None
        if raw is None:
            return default
        return _typed_override(name, raw, kind)
    if raw is None:
        return default
    if default is None:
        return text(raw)
    if isinstance(default, list | dict):
        kind_name = "tuple" if isinstance(default, list) else "object"
        raise ValueError(f"unsupported type {kind_name} for variable {name}")
    if isinstance(default, bool):
        return _primitive(name, raw, "bool")
    if isinstance(default, Num):
        return _primitive(name, raw, "number")
    return _primitive(name, raw, "string")


def _typed_override(name: str, raw: str, kind: str) -> Value:
    if kind in _TYPES:
        return _primitive(name, raw, kind)
    return _csv(name, raw, kind[5:-1])


def validate(ev: Evaluator) -> None:
    """Run every variable's validation blocks, as bake does once all variables are known.

    Bake evaluates them where only variables (and what their defaults loaded) are defined, and
    before user functions are: anything else they name is refused rather than guessed.
    """
    for block in ev.bake.variables.values():
        for rule in block.blocks:
            attrs = {
                c.identifier.serialize(): c
                for c in rule.body.children
                if isinstance(c, B.AttributeRule)
            }
            condition = attrs.get("condition")
            if condition is None:
                raise ev.error(f"variable {block.name}: validation has no condition", rule)
            for found in (condition, attrs.get("error_message")):
                if found is not None:
                    _check_scope(ev, found)
            if not ev.truth(ev.expr(condition.expression, {}), condition):
                message = attrs.get("error_message")
                reason = to_string(ev.expr(message.expression, {})) if message else "invalid"
                raise ev.error(
                    f"variable {block.name}: validation failed: {quote(reason, 200)[1:-1]}",
                    condition,
                )


def _check_scope(ev: Evaluator, rule: Any) -> None:
    variables, functions = names_used(rule.expression, ev.bake.heredocs)
    outside = [n for n in variables if n not in ev.bake.variables and n not in ev.builtins]
    if outside or any(f in ev.bake.functions for f in functions):
        raise Unfollowed(
            f"a validation that reads {quote((outside or functions)[0])} "
            f"(line {line_of(rule)}): bake scopes it to variables"
        )
