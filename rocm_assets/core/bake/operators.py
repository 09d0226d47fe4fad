"""HCL's operators and conditional as hclsyntax evaluates them over go-cty values.

Both operands of a binary operator are always evaluated, then converted to the operator's
parameter type (a number for arithmetic and ordering, a bool for `&&`/`||`). A conditional
evaluates both results and unifies their types (go-cty's UnifyUnsafe), so `true ? 1 : "a"` is the
string "1" and `true ? "a" : ["b"]` an error. A decided `&&`/`||` with an error on its other
side is refused: HCL 2.24 (upstream buildx 0.29's) drops that error, the Debian builds tested
here (0.13.1 and 0.29.1, built with Debian's HCL) fail on it.
"""

from collections.abc import Callable, Mapping
from typing import Any

from hcl2.rules import expressions as E

from rocm_assets.core.bake import ctynum
from rocm_assets.core.bake.ctynum import Num
from rocm_assets.core.bake.errors import BakeError, BakeLimitError, NeedsBuildx, Unfollowed
from rocm_assets.core.bake.evaluator import Evaluator
from rocm_assets.core.bake.values import CtySet, equal, to_bool, to_number, to_string, type_name

Value = Any

_ARITHMETIC: dict[str, Callable[[Num, Num], Num]] = {
    "+": ctynum.add,
    "-": ctynum.sub,
    "*": ctynum.mul,
    "/": ctynum.quo,
    "%": ctynum.modulo,
}
_ORDER: dict[str, Callable[[Num, Num], bool]] = {
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
}

# cty types as unification sees them: "dynamic", "string", "number", "bool", or
# ("tuple", (types...)), ("object", ((key, type)...)), ("list", type), ("map", type).
Type = Any
DYNAMIC = "dynamic"
_PRIMITIVES = ("string", "number", "bool")


def unary(ev: Evaluator, rule: E.UnaryOpRule, scope: Mapping[str, Value]) -> Value:
    value = ev.expr(rule.expr_term, scope)
    if str(rule.operator) == "!":
        return not ev.truth(value, rule)
    return ctynum.neg(to_number(value))


def binary(ev: Evaluator, rule: E.BinaryOpRule, scope: Mapping[str, Value]) -> Value:
    op = str(rule.binary_term.binary_operator.serialize()).strip()
    if op in ("&&", "||"):
        return _logical(ev, rule, op, scope)
    left = ev.expr(rule.expr_term, scope)
    right = ev.expr(rule.binary_term.expr_term, scope)
    if op in ("==", "!="):
        if isinstance(left, list | dict) or isinstance(right, list | dict):
            # cty compares collection types too (a list is never a tuple): not followed here.
            raise Unfollowed(f"{op} between collections")
        return equal(left, right) == (op == "==")
    if op in _ORDER:
        return _ORDER[op](to_number(left), to_number(right))
    if op not in _ARITHMETIC:
        raise ev.error(f"unsupported operator {op!r}", rule)
    return _ARITHMETIC[op](to_number(left), to_number(right))


def _side(ev: Evaluator, rule: Any, scope: Mapping[str, Value]) -> tuple[Value, BakeError | None]:
    try:
        return ev.expr(rule, scope), None
    except (NeedsBuildx, BakeLimitError):
        raise
    except BakeError as exc:
        return None, exc


def _logical(ev: Evaluator, rule: Any, op: str, scope: Mapping[str, Value]) -> bool:
    left, left_error = _side(ev, rule.expr_term, scope)
    right, right_error = _side(ev, rule.binary_term.expr_term, scope)
    deciding = op == "||"  # the value that decides the result on its own
    if left_error or right_error:
        other = right if left_error else left
        if not (left_error and right_error) and other is not None:
            try:
                decided = to_bool(other) == deciding
            except ValueError:
                decided = False
            if decided:
                raise Unfollowed(f"{op} with an error on one side (HCL releases differ)")
        raise left_error or right_error  # type: ignore[misc]
    lhs, rhs = ev.truth(left, rule), ev.truth(right, rule)
    return (lhs or rhs) if op == "||" else (lhs and rhs)


def conditional(ev: Evaluator, rule: E.ConditionalRule, scope: Mapping[str, Value]) -> Value:
    # Both results are evaluated: their types decide the result's type.
    if_true, true_error = _side(ev, rule.if_true, scope)
    if_false, false_error = _side(ev, rule.if_false, scope)
    chosen_true = ev.truth(ev.expr(rule.condition, scope), rule)
    chosen, error = (if_true, true_error) if chosen_true else (if_false, false_error)
    if error is not None:
        raise error
    if true_error or false_error or if_true is None or if_false is None:
        return chosen  # an unknown or null result takes the other one's type
    if isinstance(if_true, CtySet) or isinstance(if_false, CtySet):
        raise Unfollowed("a conditional with a set result")
    unified = unify(type_of(if_true), type_of(if_false))
    if unified is None:
        raise ev.error(
            "inconsistent conditional result types: "
            f"{type_name(if_true)} and {type_name(if_false)}",
            rule,
        )
    return convert(chosen, unified)


def type_of(value: Value) -> Type:
    if value is None:
        return DYNAMIC
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Num):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return ("tuple", tuple(type_of(v) for v in value))
    if isinstance(value, dict):
        return ("object", tuple(sorted((k, type_of(v)) for k, v in value.items())))
    raise Unfollowed(f"a value of type {type_name(value)}")


def _element_types(t: Type) -> list[Type]:
    if t[0] == "tuple":
        return list(t[1])
    if t[0] == "object":
        return [v for _, v in t[1]]
    return [t[1]]


def _unify_all(types: list[Type]) -> Type | None:
    result: Type = DYNAMIC
    for t in types:
        result = unify(result, t)
        if result is None:
            return None
    return result


def unify(a: Type, b: Type) -> Type | None:
    """go-cty's UnifyUnsafe for two types, or None where it finds no common type."""
    if a == b:
        return a
    if a == DYNAMIC:
        return b
    if b == DYNAMIC:
        return a
    if a in _PRIMITIVES and b in _PRIMITIVES:
        return "string" if "string" in (a, b) else None
    if isinstance(a, str) or isinstance(b, str):
        return None
    kinds = {a[0], b[0]}
    if kinds <= {"tuple", "list"}:
        if a[0] == b[0] == "tuple" and len(a[1]) == len(b[1]):
            elements = [unify(x, y) for x, y in zip(a[1], b[1], strict=True)]
            return None if None in elements else ("tuple", tuple(elements))
        element = _unify_all(_element_types(a) + _element_types(b))
        return None if element is None else ("list", element)
    if kinds <= {"object", "map"}:
        if a[0] == b[0] == "object" and [k for k, _ in a[1]] == [k for k, _ in b[1]]:
            attrs = [(k, unify(x, y)) for (k, x), (_, y) in zip(a[1], b[1], strict=True)]
            return None if any(t is None for _, t in attrs) else ("object", tuple(attrs))
        element = _unify_all(_element_types(a) + _element_types(b))
        return None if element is None else ("map", element)
    return None


def convert(value: Value, to: Type) -> Value:
    """`value` converted to the unified type `to` (a number or bool to a string, and so on)."""
    if value is None or to == DYNAMIC:
        return value
    if to == "string":
        return to_string(value)
    if isinstance(to, str):
        return value
    if to[0] == "tuple":
        return [convert(v, t) for v, t in zip(value, to[1], strict=True)]
    if to[0] == "list":
        return [convert(v, to[1]) for v in value]
    if to[0] == "object":
        types = dict(to[1])
        return {k: convert(v, types[k]) for k, v in value.items()}
    return {k: convert(v, to[1]) for k, v in value.items()}
