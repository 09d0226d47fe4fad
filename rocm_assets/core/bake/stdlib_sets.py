"""bake's set functions, and the element conversion a list parameter makes.

A go-cty set keeps its elements in its own order (strings and numbers sorted, false before
true) and has no indexes; `CtySet` is such a value here. Its elements, like a list parameter's,
must unify to one type: strings win over numbers and bools, which are then converted.
"""

import itertools
import math
from typing import Any

from rocm_assets.core.bake.ctynum import Num
from rocm_assets.core.bake.errors import Unfollowed
from rocm_assets.core.bake.limits import MAX_COLLECTION, check_length
from rocm_assets.core.bake.values import CtySet, canonical, to_string, type_name

Value = Any


def homogeneous(items: list, fn: str) -> list:
    """A tuple's elements as a list parameter receives them: unified to one primitive type."""
    kinds = {type_name(x) for x in items if x is not None}
    if len(kinds) <= 1 and not kinds & {"tuple", "object"}:
        return items
    if kinds <= {"string", "number", "bool"} and "string" in kinds:
        return [None if x is None else to_string(x) for x in items]
    if kinds <= {"number", "bool"}:
        raise ValueError(f"{fn}(): all elements must be of the same type")
    raise Unfollowed(f"{fn}() of a list of collections or of mixed types")


def _set(items: list, fn: str) -> CtySet:
    if any(x is None for x in items):
        raise Unfollowed(f"{fn}() of a set with a null element")
    unique: dict[str, Value] = {}
    for item in homogeneous(items, fn):
        unique.setdefault(canonical(item, fn), item)
    values = list(unique.values())
    if values and isinstance(values[0], str | Num | bool):
        return CtySet(sorted(values, key=lambda v: v.value if isinstance(v, Num) else v))
    return CtySet(values)


def _sets(args: tuple, fn: str) -> list[CtySet]:
    if not args:
        raise ValueError(f"{fn}(): at least one set is required")
    for arg in args:
        if not isinstance(arg, list):
            raise ValueError(f"{fn}() wants sets, got {type_name(arg)}")
    return [_set(list(arg), fn) for arg in args]


def _combine(fn: str, args: tuple, keep: Any) -> CtySet:
    sets = _sets(args, fn)
    keys = [{canonical(x, fn) for x in s} for s in sets]
    return _set([x for s in sets for x in s if keep(keys, canonical(x, fn))], fn)


def _setproduct(*args: Value) -> list:
    if any(isinstance(a, CtySet) for a in args):
        raise Unfollowed("setproduct() of sets (a set of tuples is in hash order)")
    sets = [a for a in args]
    for arg in sets:
        if not isinstance(arg, list):
            raise ValueError(f"setproduct() wants lists, got {type_name(arg)}")
    check_length(math.prod(map(len, sets)), "setproduct()", MAX_COLLECTION, "elements")
    return [list(combo) for combo in itertools.product(*sets)]


def _setsubtract(a: Value, b: Value) -> CtySet:
    left, right = _sets((a, b), "setsubtract")
    drop = {canonical(x, "setsubtract") for x in right}
    return CtySet(x for x in left if canonical(x, "setsubtract") not in drop)


def _sethaselement(s: Value, item: Value) -> bool:
    (members,) = _sets((s,), "sethaselement")
    return canonical(item, "sethaselement") in {canonical(x, "sethaselement") for x in members}


SET_FUNCTIONS = {
    "sethaselement": _sethaselement,
    "setintersection": lambda *a: _combine(
        "setintersection", a, lambda keys, k: all(k in s for s in keys)
    ),
    "setproduct": _setproduct,
    "setsubtract": _setsubtract,
    "setsymmetricdifference": lambda *a: _combine(
        "setsymmetricdifference", a, lambda keys, k: sum(k in s for s in keys) % 2 == 1
    ),
    "setunion": lambda *a: _combine("setunion", a, lambda keys, k: True),
}
# What may take a set as it is; any other function given one is refused.
TAKES_SETS = frozenset(
    {*SET_FUNCTIONS, "length", "join", "contains", "jsonencode", "distinct", "sort", "flatten"}
)
