"""bake's HCL stdlib (buildx `bake/hclparser/stdlib.go`) as it evaluates offline.

Each function takes already evaluated values (see `values`) and raises ValueError with a short
reason where bake raises an error; the evaluator adds the file and line, and sizes and charges
what comes back. Where go-cty's answer depends on what this evaluator does not track (a set's or
a list's element type, a float64 function's rounding, a grapheme cluster) the function raises
`Unfollowed`, and the resolver refuses. `try` and `can` are not here: they need their arguments
unevaluated. Numbers are in `ctynum`; strings and time in `stdlib_text`, `stdlib_time`; sets and
paths in `stdlib_sets`.
"""

import csv
import itertools
import json
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from rocm_assets.core.bake import ctynum
from rocm_assets.core.bake.ctynum import Num
from rocm_assets.core.bake.errors import Unfollowed
from rocm_assets.core.bake.limits import (
    MAX_COLLECTION,
    MAX_STRING,
    check_length,
    expanded_size,
    quote,
)
from rocm_assets.core.bake.stdlib_format import FORMAT_FUNCTIONS
from rocm_assets.core.bake.stdlib_net import NET_FUNCTIONS
from rocm_assets.core.bake.stdlib_sets import SET_FUNCTIONS, homogeneous
from rocm_assets.core.bake.stdlib_text import TEXT_FUNCTIONS, as_list
from rocm_assets.core.bake.stdlib_time import TIME_FUNCTIONS
from rocm_assets.core.bake.values import (
    canonical,
    equal,
    number,
    to_bool,
    to_int,
    to_json,
    to_number,
    to_string,
    type_name,
)

Value = Any

# go-cty's range() refuses more than this many values, so bake does too.
MAX_RANGE = 1024

# In bake's stdlib but not evaluated here: each needs something an offline check cannot have
# or should not do, or its answer changes from call to call.
UNSUPPORTED = {
    "bcrypt": "its salt is random",
    "rsadecrypt": "it needs a private key",
    "byteslen": "bake's bytes values have no equivalent here",
    "bytesslice": "bake's bytes values have no equivalent here",
    "convert": "it takes a type expression",
    "semvercmp": "it is newer than buildx 0.29",
    "formattimestamp": "it is newer than buildx 0.29",
    "unixtimestampparse": "it is newer than buildx 0.29",
    "uuidv4": "its value is random",
    "timestamp": "its value is the time bake runs",
    "homedir": "its value is bake's home directory",
    "log": "it is Go's float64 logarithm",
}
# Functions whose parameters accept null (go-cty's AllowNull).
ALLOW_NULL = frozenset(
    {"coalesce", "coalescelist", "merge", "format", "formatlist", "equal", "notequal", "jsonencode"}
)


def _dict(value: Value, fn: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{fn}() wants an object, got {type_name(value)}")
    return value


def _range(*args: Value) -> list:
    """go-cty's range: (limit), (start, limit) or (start, limit, step); at most 1024 values."""
    nums = [to_number(a) for a in args]
    zero, one = number(0), number(1)
    if len(nums) == 1:
        start, stop, step = zero, nums[0], number(-1) if nums[0] < zero else one
    elif len(nums) == 2:
        start, stop = nums
        step = number(-1) if stop < start else one
    elif len(nums) == 3:
        start, stop, step = nums
    else:
        raise ValueError("range(): must have one, two, or three arguments")
    down = step < zero
    if down and stop > start:
        raise ValueError("range(): end must be less than start when step is negative")
    if not down and stop < start:
        raise ValueError("range(): end must be greater than start when step is positive")
    # start, start+step, ...: each sum rounded to the larger precision, as repeated Adds are.
    if start.value.denominator == step.value.denominator == 1 and step.value:
        return _int_range(start, stop, step)
    out: list[Num] = []
    current, prec = start, max(start.prec, step.prec)
    value, limit, delta = start.value, stop.value, step.value
    while (value > limit) if down else (value < limit):
        if len(out) >= MAX_RANGE:
            # bake's own error (go-cty), so try() catches it as it would in bake.
            raise ValueError("range(): more than 1024 values were generated")
        out.append(current)
        current = ctynum.make(value + delta, prec)
        value = current.value
    return out


def _int_range(start: Num, stop: Num, step: Num) -> list:
    """range() over whole numbers, without rounding while they fit their precision."""
    first, delta, prec = int(start.value), int(step.value), max(start.prec, step.prec)
    count = max(0, math.ceil((stop.value - first) / delta))
    if count > MAX_RANGE:
        raise ValueError("range(): more than 1024 values were generated")
    if abs(first) + count * abs(delta) >= 1 << prec:
        raise Unfollowed("range() beyond its numbers' precision")
    return [start, *(Num(Fraction(first + i * delta), prec) for i in range(1, count))]


def _flatten(value: Value) -> list:
    expanded_size(value, MAX_COLLECTION, "flatten()")
    out: list = []
    stack = [iter(as_list(value, "flatten"))]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        else:
            out.append(item)
    return out


_END = object()


def _merge(*objects: Value) -> dict:
    out: dict = {}
    for obj in objects:
        if obj is not None:
            out.update(_dict(obj, "merge"))
    return out


def _lookup(obj: Value, key: Value, *default: Value) -> Value:
    mapping, key = _dict(obj, "lookup"), to_string(key)
    if key in mapping:
        return mapping[key]
    if default:
        return default[0]
    raise ValueError(f"lookup(): no key {quote(key)} and no default")


def _element(lst: Value, index: Value) -> Value:
    items, i = as_list(lst, "element"), to_int(index, "invalid index")
    if not items:
        raise ValueError("element(): cannot use element function with an empty list")
    if i < 0:
        # Both releases as built (Debian's go-cty) refuse it; newer go-cty counts from the end.
        raise ValueError("element(): cannot use element function with a negative index")
    return items[i % len(items)]


def _index(collection: Value, key: Value) -> Value:
    """go-cty's index(collection, key): the element at a list index (a number, not converted)."""
    if isinstance(collection, dict):
        raise Unfollowed("index() of an object (bake takes maps only)")
    items = as_list(collection, "index")
    if not isinstance(key, Num):
        raise ValueError("key for tuple must be number")
    i = to_int(key, "invalid key for tuple")
    if not 0 <= i < len(items):
        raise ValueError(f"key must be between 0 and {len(items) - 1} inclusive")
    return items[i]


def _indexof(lst: Value, item: Value) -> Num:
    items = as_list(lst, "indexof")
    if not items:
        raise ValueError("indexof(): cannot search an empty list")
    for i, candidate in enumerate(items):
        if isinstance(candidate, list | dict):
            raise Unfollowed("indexof() of collections")
        if equal(candidate, item):
            return number(i)
    raise ValueError("indexof(): item not found")


def _distinct(lst: Value) -> list:
    items = homogeneous(as_list(lst, "distinct"), "distinct")
    seen: dict[str, Value] = {}
    for item in items:
        seen.setdefault(canonical(item, "distinct"), item)
    return list(seen.values())


def _chunklist(lst: Value, size: Value) -> list:
    items, n = homogeneous(as_list(lst, "chunklist"), "chunklist"), to_int(size, "invalid size")
    if n < 0:
        raise ValueError("chunklist(): the size argument must be positive")
    if not items:
        return []
    return [items] if n == 0 else [items[i : i + n] for i in range(0, len(items), n)]


def _csvdecode(text: Value) -> list:
    raw = to_string(text)
    if '"' in raw or "\r" in raw:
        raise Unfollowed("csvdecode() of quoted fields (Go's encoding/csv is not followed)")
    rows = list(itertools.islice(csv.reader(raw.splitlines()), MAX_COLLECTION + 2))
    if not rows:
        raise ValueError("csvdecode(): missing header line")
    check_length(len(rows) - 1, "csvdecode()", MAX_COLLECTION, "rows")
    header = rows[0]
    for row in rows[1:]:
        if len(row) != len(header):
            raise ValueError("csvdecode(): a row does not have as many fields as the header")
    return [dict(zip(header, row, strict=True)) for row in rows[1:]]


def _jsonencode(value: Value) -> str:
    expanded_size(value, MAX_STRING, "jsonencode()")
    return to_json(value)


def _jsondecode(text: Value) -> Value:
    try:
        value = json.loads(
            to_string(text),
            parse_constant=_refuse_constant,
            parse_int=ctynum.literal,
            parse_float=ctynum.literal,
        )
    except RecursionError:
        raise ValueError("jsondecode(): the JSON nests too deep") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"jsondecode(): {exc.msg} at character {exc.pos}") from None
    return value


def _refuse_constant(name: str) -> None:
    raise ValueError(f"jsondecode(): {name} is not JSON")


_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _parseint(text: Value, base: Value) -> Num:
    """big.Int.SetString(text, base): an optional sign, then digits of the base only."""
    b = to_int(base, "parseint()'s base")
    if not 2 <= b <= 62:
        raise ValueError("parseint(): base must be a whole number between 2 and 62 inclusive")
    if b > 36:
        raise Unfollowed("parseint() with a base over 36")
    raw = to_string(text)
    digits = raw[1:] if raw[:1] in "+-" else raw
    if not digits or len(digits) > 1100 or any(c.lower() not in _DIGITS[:b] for c in digits):
        raise ValueError(f"parseint(): cannot parse {quote(raw)} as a base {b} integer")
    return ctynum.from_int(int(raw, b))


def _pow(base: Value, exponent: Value) -> Num:
    """math.Pow on float64s, followed only where every algorithm gives the exact result."""
    x, y = ctynum.to_float(to_number(base)), ctynum.to_float(to_number(exponent))
    if y == 0 or x == 1:
        return ctynum.from_float(1.0)
    if x == 0:
        if y < 0:
            raise Unfollowed("pow() of zero to a negative power (bake makes an infinity)")
        return ctynum.from_float(x if y.is_integer() and int(y) % 2 else 0.0)
    if not y.is_integer() or abs(y) > 1074:
        raise Unfollowed("pow() with a non-integer or huge exponent (Go's float64 pow)")
    exact = Fraction(x) ** int(abs(y))
    odd_numerator = exact.numerator >> ((exact.numerator & -exact.numerator).bit_length() - 1)
    if exact != 0 and (odd_numerator >= 1 << 53 or not 2.0**-1022 <= abs(exact) < 2.0**1023):
        raise Unfollowed("pow() whose result is not exactly a float64")
    result = float(exact)
    return ctynum.from_float(1 / result if y < 0 else result)


def _ceil_floor(up: bool) -> Callable[[Value], Num]:
    def fn(value: Value) -> Num:
        n = to_number(value)
        whole = -((-n.value.numerator) // n.value.denominator) if up else n.value.__floor__()
        return ctynum.make(Fraction(whole), n.prec)

    return fn


def _int(value: Value) -> Num:
    n = to_number(value)
    if n.is_int():
        return n
    return ctynum.from_int(int(n.value))


def _signum(value: Value) -> Num:
    n = ctynum.to_int64(to_number(value))
    return number((n > 0) - (n < 0))


def _extreme(pick_greater: bool) -> Callable[..., Num]:
    def fn(*values: Value) -> Num:
        if not values:
            raise ValueError("must pass at least one number")
        nums = [to_number(v) for v in values]
        best = nums[0]
        for n in nums[1:]:
            if (n > best) if pick_greater else (n < best):
                best = n
        return best

    return fn


def _coalesce(*values: Value) -> Value:
    present = [v for v in values if v is not None]
    if not present:
        raise ValueError("coalesce(): no non-null arguments")
    kinds = {type_name(v) for v in present}
    if len(kinds) > 1:
        if kinds <= {"string", "number", "bool"} and "string" in kinds:
            return to_string(present[0])  # the arguments unify to string
        raise Unfollowed("coalesce() of values of different types")
    return present[0]


def _coalescelist(*lists: Value) -> Value:
    for lst in lists:
        if lst is not None and as_list(lst, "coalescelist"):
            return lst
    raise ValueError("coalescelist(): no non-null arguments")


def _compact(lst: Value) -> list:
    return [s for s in (_list_string(x, "compact") for x in as_list(lst, "compact")) if s]


def _list_string(item: Value, fn: str) -> str:
    """An element of a list(string) parameter: converted, never null."""
    if item is None:
        raise ValueError(f"{fn}(): a list element must not be null")
    return to_string(item)


def _concat(*lists: Value) -> list:
    parts = [as_list(lst, "concat") for lst in lists]
    check_length(sum(map(len, parts)), "concat()", MAX_COLLECTION, "elements")
    return [x for part in parts for x in part]


def _slice(items: list, start: Value, end: Value) -> list:
    a, b = to_int(start, "invalid start index"), to_int(end, "invalid end index")
    if a < 0 or b > len(items) or a > b:
        raise ValueError(f"slice(): indexes {a} and {b} are outside a list of {len(items)}")
    return items[a:b]


def _length(value: Value) -> Num:
    if isinstance(value, dict):
        # go-cty counts a map but refuses an object, and which one a value is is not tracked.
        raise Unfollowed("length() of an object or map")
    if isinstance(value, list):
        return number(len(value))
    raise ValueError("collection must be a list, a map or a tuple")


def _sort(lst: Value) -> list:
    return sorted(_list_string(x, "sort") for x in as_list(lst, "sort"))


def _contains(lst: Value, item: Value) -> bool:
    items = as_list(lst, "contains")
    if isinstance(item, list | dict) or any(isinstance(x, list | dict) for x in items):
        raise Unfollowed("contains() of collections")
    return any(equal(x, item) for x in items)


def _equal(a: Value, b: Value) -> bool:
    if isinstance(a, list | dict) or isinstance(b, list | dict):
        raise Unfollowed("equal() of collections")
    return equal(a, b)


def _keys(obj: Value) -> list:
    return sorted(_dict(obj, "keys"))


def _zipmap(keys: Value, values: Value) -> dict:
    names = [_list_string(k, "zipmap") for k in as_list(keys, "zipmap")]
    items = as_list(values, "zipmap")
    if len(names) != len(items):
        raise ValueError(
            f"number of keys ({len(names)}) does not match number of values ({len(items)})"
        )
    if len(set(names)) != len(names):
        raise Unfollowed("zipmap() with a key twice")
    return dict(zip(names, items, strict=True))


FUNCTIONS: dict[str, Callable[..., Value]] = {
    **TEXT_FUNCTIONS,
    **FORMAT_FUNCTIONS,
    **NET_FUNCTIONS,
    **TIME_FUNCTIONS,
    **SET_FUNCTIONS,
    "absolute": lambda n: ctynum.absolute(to_number(n)),
    "add": lambda a, b: ctynum.add(to_number(a), to_number(b)),
    "and": lambda a, b: to_bool(a) and to_bool(b),
    "ceil": _ceil_floor(up=True),
    "chunklist": _chunklist,
    "coalesce": _coalesce,
    "coalescelist": _coalescelist,
    "compact": _compact,
    "concat": _concat,
    "contains": _contains,
    "csvdecode": _csvdecode,
    "distinct": _distinct,
    "divide": lambda a, b: ctynum.quo(to_number(a), to_number(b)),
    "element": _element,
    "equal": _equal,
    "flatten": _flatten,
    "floor": _ceil_floor(up=False),
    "greaterthan": lambda a, b: to_number(a) > to_number(b),
    "greaterthanorequalto": lambda a, b: to_number(a) >= to_number(b),
    "hasindex": lambda c, i: (
        to_string(i) in c
        if isinstance(c, dict)
        else 0 <= to_int(i, "hasindex()'s index") < len(as_list(c, "hasindex"))
    ),
    "index": _index,
    "indexof": _indexof,
    "int": _int,
    "jsondecode": _jsondecode,
    "jsonencode": _jsonencode,
    "keys": _keys,
    "length": _length,
    "lessthan": lambda a, b: to_number(a) < to_number(b),
    "lessthanorequalto": lambda a, b: to_number(a) <= to_number(b),
    "lookup": _lookup,
    "max": _extreme(pick_greater=True),
    "merge": _merge,
    "min": _extreme(pick_greater=False),
    "modulo": lambda a, b: ctynum.modulo(to_number(a), to_number(b)),
    "multiply": lambda a, b: ctynum.mul(to_number(a), to_number(b)),
    "negate": lambda n: ctynum.neg(to_number(n)),
    "not": lambda b: not to_bool(b),
    "notequal": lambda a, b: not _equal(a, b),
    "or": lambda a, b: to_bool(a) or to_bool(b),
    "parseint": _parseint,
    "pow": _pow,
    "range": _range,
    "reverselist": lambda lst: list(reversed(as_list(lst, "reverselist"))),
    "signum": _signum,
    "slice": lambda lst, a, b: _slice(as_list(lst, "slice"), a, b),
    "sort": _sort,
    "subtract": lambda a, b: ctynum.sub(to_number(a), to_number(b)),
    "values": lambda obj: [v for _, v in sorted(_dict(obj, "values").items())],
    "zipmap": _zipmap,
}
