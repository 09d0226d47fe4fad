"""The subset of bake's HCL stdlib (buildx `bake/hclparser/stdlib.go`) that evaluates offline.

Each function takes already evaluated Python values (str, bool, int, float, None, list, dict) and
raises ValueError with a short reason; the evaluator adds the file and line. `try` and `can` are
not here: they need their arguments unevaluated, so the evaluator implements them.
"""

import json
import math
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

Value = Any

# What Go's strconv.ParseBool reads, as bake applies it to an env override of a bool variable.
PARSE_BOOL_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
PARSE_BOOL_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def to_string(value: Value) -> str:
    """Convert a primitive the way go-cty does for interpolation and string arguments."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if value is None:
        raise ValueError("a null value cannot be used as a string")
    raise ValueError(f"a {type_name(value)} cannot be used as a string")


def to_number(value: Value) -> int | float:
    if isinstance(value, bool):
        raise ValueError("a bool cannot be used as a number")
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a number") from None
        return int(number) if number.is_integer() else number
    raise ValueError(f"a {type_name(value)} cannot be used as a number")


def to_bool(value: Value) -> bool:
    """HCL's bool conversion: only the strings "true"/"1" and "false"/"0" convert."""
    if isinstance(value, bool):
        return value
    if value is None:
        raise ValueError("null condition")
    if isinstance(value, str) and value in ("true", "1"):
        return True
    if isinstance(value, str) and value in ("false", "0"):
        return False
    raise ValueError(f"incorrect condition type: {value!r} is not a bool")


def type_name(value: Value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "tuple"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _normal(number: float) -> int | float:
    return int(number) if float(number).is_integer() else number


def _list(value: Value, fn: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{fn}() wants a list, got {type_name(value)}")
    return value


def _dict(value: Value, fn: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{fn}() wants an object, got {type_name(value)}")
    return value


def _format(fmt: str, *args: Value) -> str:
    """Go-style format with the verbs bake files use: %s %d %v %q %f %%."""
    out: list[str] = []
    it = iter(args)
    i = 0
    while i < len(fmt):
        ch = fmt[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        verb = fmt[i + 1 : i + 2]
        i += 2
        if verb == "%":
            out.append("%")
            continue
        try:
            arg = next(it)
        except StopIteration:
            raise ValueError("format(): not enough arguments for the format string") from None
        if verb in ("s", "v"):
            out.append(to_string(arg))
        elif verb == "d":
            out.append(str(int(to_number(arg))))
        elif verb == "f":
            out.append(f"{float(to_number(arg)):f}")
        elif verb == "q":
            out.append(json.dumps(to_string(arg)))
        else:
            raise ValueError(f"format(): unsupported verb %{verb}")
    return "".join(out)


def _replace(s: Value, old: Value, new: Value) -> str:
    s, old, new = to_string(s), to_string(old), to_string(new)
    if len(old) > 1 and old.startswith("/") and old.endswith("/"):
        return re.sub(old[1:-1], _go_repl(new), s)
    return s.replace(old, new)


def _go_repl(repl: str) -> str:
    # Go writes capture groups as $1 or ${1}; Python as \1.
    return re.sub(r"\$\{?(\d+)\}?", r"\\\1", repl)


def _sanitize(s: Value) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", to_string(s))


def _flatten(value: Value) -> list:
    out: list = []
    for item in _list(value, "flatten"):
        out.extend(_flatten(item) if isinstance(item, list) else [item])
    return out


def _merge(*objects: Value) -> dict:
    out: dict = {}
    for obj in objects:
        if obj is None:
            continue
        out.update(_dict(obj, "merge"))
    return out


def _lookup(obj: Value, key: Value, *default: Value) -> Value:
    mapping = _dict(obj, "lookup")
    key = to_string(key)
    if key in mapping:
        return mapping[key]
    if default:
        return default[0]
    raise ValueError(f"lookup(): no key {key!r} and no default")


def _element(lst: Value, index: Value) -> Value:
    items = _list(lst, "element")
    if not items:
        raise ValueError("element(): empty list")
    return items[int(to_number(index)) % len(items)]


def _index(lst: Value, item: Value) -> int:
    items = _list(lst, "index")
    if item not in items:
        raise ValueError(f"index(): {item!r} is not in the list")
    return items.index(item)


def _coalesce(*values: Value) -> Value:
    for v in values:
        if v is not None and v != "":
            return v
    raise ValueError("coalesce(): no non-null, non-empty argument")


def _substr(s: Value, offset: Value, length: Value) -> str:
    text, start, count = to_string(s), int(to_number(offset)), int(to_number(length))
    if start < 0:
        start += len(text)
    return text[start:] if count < 0 else text[start : start + count]


def _range(*args: Value) -> list:
    nums = [to_number(a) for a in args]
    start, stop, step = (
        (0, nums[0], 1) if len(nums) == 1 else (*nums[:2], nums[2] if len(nums) > 2 else 1)
    )
    out = []
    value = start
    while (step > 0 and value < stop) or (step < 0 and value > stop):
        out.append(_normal(value))
        value += step
    return out


def _homedir() -> str:
    return os.path.expanduser("~")


FUNCTIONS: dict[str, Callable[..., Value]] = {
    "abs": lambda n: abs(to_number(n)),
    "add": lambda a, b: _normal(to_number(a) + to_number(b)),
    "and": lambda a, b: to_bool(a) and to_bool(b),
    "basename": lambda s: os.path.basename(to_string(s)),
    "ceil": lambda n: math.ceil(to_number(n)),
    "chomp": lambda s: to_string(s).rstrip("\r\n"),
    "coalesce": _coalesce,
    "coalescelist": lambda *ls: next((x for x in ls if _list(x, "coalescelist")), []),
    "compact": lambda lst: [x for x in _list(lst, "compact") if x not in ("", None)],
    "concat": lambda *ls: [x for lst in ls for x in _list(lst, "concat")],
    "contains": lambda lst, item: item in _list(lst, "contains"),
    "dirname": lambda s: os.path.dirname(to_string(s)),
    "distinct": lambda lst: list(dict.fromkeys(_list(lst, "distinct"))),
    "divide": lambda a, b: _normal(to_number(a) / to_number(b)),
    "element": _element,
    "equal": lambda a, b: a == b and type_name(a) == type_name(b),
    "flatten": _flatten,
    "floor": lambda n: math.floor(to_number(n)),
    "format": lambda fmt, *args: _format(to_string(fmt), *args),
    "formatlist": lambda fmt, lst: [_format(to_string(fmt), x) for x in _list(lst, "formatlist")],
    "greaterthan": lambda a, b: to_number(a) > to_number(b),
    "greaterthanorequalto": lambda a, b: to_number(a) >= to_number(b),
    "hasindex": lambda c, i: (i in c) if isinstance(c, dict) else 0 <= int(to_number(i)) < len(c),
    "homedir": _homedir,
    "index": _index,
    "indexof": _index,
    "join": lambda sep, *ls: to_string(sep).join(
        to_string(x) for lst in ls for x in _list(lst, "join")
    ),
    "jsondecode": lambda s: json.loads(to_string(s)),
    "jsonencode": lambda v: json.dumps(v, separators=(",", ":")),
    "keys": lambda obj: sorted(_dict(obj, "keys")),
    "length": lambda v: len(v) if isinstance(v, list | dict | str) else len(to_string(v)),
    "lessthan": lambda a, b: to_number(a) < to_number(b),
    "lessthanorequalto": lambda a, b: to_number(a) <= to_number(b),
    "lookup": _lookup,
    "lower": lambda s: to_string(s).lower(),
    "max": lambda *ns: max(to_number(n) for n in ns),
    "merge": _merge,
    "min": lambda *ns: min(to_number(n) for n in ns),
    "modulo": lambda a, b: _normal(math.fmod(to_number(a), to_number(b))),
    "multiply": lambda a, b: _normal(to_number(a) * to_number(b)),
    "negate": lambda n: -to_number(n),
    "not": lambda b: not to_bool(b),
    "notequal": lambda a, b: not (a == b and type_name(a) == type_name(b)),
    "or": lambda a, b: to_bool(a) or to_bool(b),
    "parseint": lambda s, base: int(to_string(s), int(to_number(base))),
    "pow": lambda a, b: _normal(to_number(a) ** to_number(b)),
    "range": _range,
    "regex_replace": lambda s, pat, repl: re.sub(
        to_string(pat), _go_repl(to_string(repl)), to_string(s)
    ),
    "replace": _replace,
    "reverse": lambda v: list(reversed(v)) if isinstance(v, list) else to_string(v)[::-1],
    "reverselist": lambda lst: list(reversed(_list(lst, "reverselist"))),
    "sanitize": _sanitize,
    "signum": lambda n: (to_number(n) > 0) - (to_number(n) < 0),
    "slice": lambda lst, a, b: _list(lst, "slice")[int(to_number(a)) : int(to_number(b))],
    "sort": lambda lst: sorted(to_string(x) for x in _list(lst, "sort")),
    "split": lambda sep, s: to_string(s).split(to_string(sep)),
    "strlen": lambda s: len(to_string(s)),
    "substr": _substr,
    "subtract": lambda a, b: _normal(to_number(a) - to_number(b)),
    "timestamp": lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "title": lambda s: to_string(s).title(),
    "trim": lambda s, cut: to_string(s).strip(to_string(cut)),
    "trimprefix": lambda s, p: to_string(s).removeprefix(to_string(p)),
    "trimspace": lambda s: to_string(s).strip(),
    "trimsuffix": lambda s, p: to_string(s).removesuffix(to_string(p)),
    "upper": lambda s: to_string(s).upper(),
    "values": lambda obj: [v for _, v in sorted(_dict(obj, "values").items())],
    "zipmap": lambda ks, vs: dict(
        zip((to_string(k) for k in _list(ks, "zipmap")), _list(vs, "zipmap"), strict=True)
    ),
}
