"""bake's HCL stdlib (buildx `bake/hclparser/stdlib.go`) as it evaluates offline.

Each function takes already evaluated values (see `values`) and raises ValueError with a short
reason; the evaluator adds the file and line, and sizes and charges what comes back. `try` and
`can` are not here: they need their arguments unevaluated, so the evaluator implements them.
Numbers and collections follow go-cty; strings and time are in `stdlib_text`, `stdlib_time`.
"""

import csv
import ipaddress
import itertools
import json
import math
import os
from collections.abc import Callable
from typing import Any

from rocm_assets.core.bake.limits import (
    MAX_COLLECTION,
    MAX_STRING,
    check_length,
    expanded_size,
    quote,
)
from rocm_assets.core.bake.stdlib_text import TEXT_FUNCTIONS, as_list
from rocm_assets.core.bake.stdlib_time import TIME_FUNCTIONS
from rocm_assets.core.bake.values import (
    canonical,
    equal,
    number,
    parse_number,
    to_bool,
    to_int,
    to_number,
    to_string,
    type_name,
)

Value = Any

# go-cty's range() refuses more than this many values, so bake does too.
MAX_RANGE = 1024

# In bake's stdlib but not evaluated here: each needs something an offline check cannot have
# or should not do (secrets, bytes capsules, type expressions, semver constraints).
UNSUPPORTED = {
    "bcrypt": "its salt is random, so the value would differ from bake's",
    "rsadecrypt": "it needs a private key",
    "byteslen": "bake's bytes values have no equivalent here",
    "bytesslice": "bake's bytes values have no equivalent here",
    "convert": "it takes a type expression",
    "semvercmp": "it needs Go semver constraint semantics",
    "formattimestamp": "it is not in the buildx release this evaluator follows",
    "unixtimestampparse": "it is not in the buildx release this evaluator follows",
}


def _dict(value: Value, fn: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{fn}() wants an object, got {type_name(value)}")
    return value


def _range(*args: Value) -> list:
    """go-cty's range: (limit), (start, limit) or (start, limit, step); at most 1024 values."""
    nums = [to_number(a) for a in args]
    if len(nums) == 1:
        start, stop, step = 0, nums[0], -1 if nums[0] < 0 else 1
    elif len(nums) == 2:
        start, stop = nums
        step = -1 if stop < start else 1
    elif len(nums) == 3:
        start, stop, step = nums
    else:
        raise ValueError("range() takes one, two or three numbers")
    if step == 0:
        raise ValueError("range(): step must not be zero")
    if (step < 0 and stop > start) or (step > 0 and stop < start):
        raise ValueError("range(): the step goes away from the limit")
    count = max(0, math.ceil((stop - start) / step))
    if count > MAX_RANGE:
        # bake's own error (go-cty), so try() catches it as it would in bake.
        raise ValueError(f"range() would make {count} elements, over the limit of {MAX_RANGE}")
    return [number(start + i * step) for i in range(count)]


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
    items, i = as_list(lst, "element"), to_int(index, "element()'s index")
    if not items:
        raise ValueError("element(): cannot use element function with an empty list")
    if i < 0:
        raise ValueError("element(): cannot use element function with a negative index")
    return items[i % len(items)]


def _index(lst: Value, item: Value) -> int:
    for i, candidate in enumerate(as_list(lst, "index")):
        if equal(candidate, item):
            return i
    raise ValueError("index(): item not found")


def _distinct(items: list, fn: str) -> list:
    seen: dict[str, Value] = {}
    for item in items:
        seen.setdefault(canonical(item, fn), item)
    return list(seen.values())


def _set_args(args: tuple, fn: str) -> list[list]:
    if not args:
        raise ValueError(f"{fn}() needs at least one set")
    return [_distinct(as_list(a, fn), fn) for a in args]


def _setop(fn: str, keep: Callable[[list[set[str]], str], bool]) -> Callable[..., list]:
    def op(*args: Value) -> list:
        sets = _set_args(args, fn)
        keys = [{canonical(x, fn) for x in s} for s in sets]
        return _distinct([x for s in sets for x in s if keep(keys, canonical(x, fn))], fn)

    return op


def _setproduct(*args: Value) -> list:
    sets = [as_list(a, "setproduct") for a in args]
    check_length(math.prod(map(len, sets)), "setproduct()", MAX_COLLECTION, "elements")
    return [list(combo) for combo in itertools.product(*sets)]


def _chunklist(lst: Value, size: Value) -> list:
    items, n = as_list(lst, "chunklist"), to_int(size, "chunklist()'s size")
    if n < 0:
        raise ValueError("chunklist(): the size must not be negative")
    return [items] if n == 0 else [items[i : i + n] for i in range(0, len(items), n)]


def _csvdecode(text: Value) -> list:
    rows = list(itertools.islice(csv.reader(to_string(text).splitlines()), MAX_COLLECTION + 2))
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
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _jsondecode(text: Value) -> Value:
    try:
        value = json.loads(
            to_string(text),
            parse_constant=_refuse_constant,
            parse_int=parse_number,
            parse_float=parse_number,
        )
    except RecursionError:
        raise ValueError("jsondecode(): the JSON nests too deep") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"jsondecode(): {exc.msg} at character {exc.pos}") from None
    return value


def _refuse_constant(name: str) -> None:
    raise ValueError(f"jsondecode(): {name} is not JSON")


def _parseint(text: Value, base: Value) -> int:
    b = to_int(base, "parseint()'s base")
    if not 2 <= b <= 62:
        raise ValueError("parseint(): the base must be between 2 and 62")
    raw = to_string(text)
    if len(raw) > 1100:
        raise ValueError("parseint(): number out of range")
    try:
        return number(int(raw, b))
    except ValueError:
        raise ValueError(f"parseint(): {quote(raw)} is not a base-{b} number") from None


def _pow(base: Value, exponent: Value) -> int | float:
    a, b = to_number(base), to_number(exponent)
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
        # Refuse before computing: 10 ** 10**9 would take minutes as an exact int.
        if b * math.log2(abs(a)) > 1030:
            raise ValueError("pow(): number out of range")
    return number(math.pow(a, b) if isinstance(b, float) or b < 0 else a**b)


def _cidr(prefix: Value) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(to_string(prefix), strict=False)
    except ValueError:
        raise ValueError(f"{quote(to_string(prefix))} is not a CIDR prefix") from None


def _cidrhost(prefix: Value, hostnum: Value) -> str:
    net, n = _cidr(prefix), to_int(hostnum, "cidrhost()'s host number")
    if not -net.num_addresses <= n < net.num_addresses:
        raise ValueError(f"cidrhost(): prefix has no host number {n}")
    return str(net[n])


def _cidrsubnet(prefix: Value, newbits: Value, netnum: Value) -> str:
    net = _cidr(prefix)
    bits, num = to_int(newbits, "cidrsubnet()'s newbits"), to_int(netnum, "cidrsubnet()'s netnum")
    if not 0 <= bits <= net.max_prefixlen - net.prefixlen or not 0 <= num < (1 << bits):
        raise ValueError("cidrsubnet(): newbits or netnum out of range for the prefix")
    size = 1 << (net.max_prefixlen - net.prefixlen - bits)
    first = int(net.network_address) + num * size
    return str(ipaddress.ip_network((first, net.prefixlen + bits)))


def _cidrsubnets(prefix: Value, *newbits: Value) -> list:
    net = _cidr(prefix)
    out, cursor = [], int(net.network_address)
    for bits in (to_int(b, "cidrsubnets()'s newbits") for b in newbits):
        length = net.prefixlen + bits
        if not net.prefixlen <= length <= net.max_prefixlen:
            raise ValueError("cidrsubnets(): newbits out of range for the prefix")
        size = 1 << (net.max_prefixlen - length)
        cursor = (cursor + size - 1) // size * size
        subnet = ipaddress.ip_network((cursor, length))
        if not subnet.subnet_of(net):  # type: ignore[arg-type]
            raise ValueError("cidrsubnets(): not enough room in the prefix")
        out.append(str(subnet))
        cursor += size
    return out


def _log(n: Value, base: Value) -> float:
    try:
        return number(math.log(to_number(n), to_number(base)))
    except (ValueError, ZeroDivisionError):
        raise ValueError("log(): the number and the base must be positive") from None


def _sort(lst: Value) -> list:
    return sorted(to_string(x) for x in as_list(lst, "sort"))


def _coalesce(*values: Value) -> Value:
    for value in values:
        if value is not None and value != "":
            return value
    raise ValueError("coalesce(): no non-null, non-empty argument")


def _concat(*lists: Value) -> list:
    parts = [as_list(lst, "concat") for lst in lists]
    check_length(sum(map(len, parts)), "concat()", MAX_COLLECTION, "elements")
    return [x for part in parts for x in part]


def _slice(items: list, start: Value, end: Value) -> list:
    a, b = to_int(start, "slice()'s start"), to_int(end, "slice()'s end")
    if not 0 <= a <= b <= len(items):
        raise ValueError(f"slice(): indexes {a} and {b} are outside a list of {len(items)}")
    return items[a:b]


FUNCTIONS: dict[str, Callable[..., Value]] = {
    **TEXT_FUNCTIONS,
    **TIME_FUNCTIONS,
    "absolute": lambda n: abs(to_number(n)),
    "add": lambda a, b: number(to_number(a) + to_number(b)),
    "and": lambda a, b: to_bool(a) and to_bool(b),
    "basename": lambda s: os.path.basename(to_string(s).rstrip("/")) or "/",
    "ceil": lambda n: number(math.ceil(to_number(n))),
    "chunklist": _chunklist,
    "cidrhost": _cidrhost,
    "cidrnetmask": lambda p: str(_cidr(p).netmask),
    "cidrsubnet": _cidrsubnet,
    "cidrsubnets": _cidrsubnets,
    "coalesce": _coalesce,
    "coalescelist": lambda *ls: next((x for x in ls if as_list(x, "coalescelist")), []),
    "compact": lambda lst: [x for x in as_list(lst, "compact") if x not in ("", None)],
    "concat": _concat,
    "contains": lambda lst, item: any(equal(x, item) for x in as_list(lst, "contains")),
    "csvdecode": _csvdecode,
    "dirname": lambda s: os.path.dirname(to_string(s).rstrip("/")) or ".",
    "distinct": lambda lst: _distinct(as_list(lst, "distinct"), "distinct"),
    "divide": lambda a, b: number(to_number(a) / to_number(b)),
    "element": _element,
    "equal": equal,
    "flatten": _flatten,
    "floor": lambda n: number(math.floor(to_number(n))),
    "greaterthan": lambda a, b: to_number(a) > to_number(b),
    "greaterthanorequalto": lambda a, b: to_number(a) >= to_number(b),
    "hasindex": lambda c, i: (
        to_string(i) in c
        if isinstance(c, dict)
        else 0 <= to_int(i, "hasindex()'s index") < len(as_list(c, "hasindex"))
    ),
    "homedir": lambda: os.path.expanduser("~"),
    "index": _index,
    "indexof": _index,
    "int": lambda n: number(math.trunc(to_number(n))),
    "jsondecode": _jsondecode,
    "jsonencode": _jsonencode,
    "keys": lambda obj: sorted(_dict(obj, "keys")),
    "length": lambda v: len(v) if isinstance(v, list | dict | str) else len(to_string(v)),
    "lessthan": lambda a, b: to_number(a) < to_number(b),
    "lessthanorequalto": lambda a, b: to_number(a) <= to_number(b),
    "log": _log,
    "lookup": _lookup,
    "max": lambda *ns: max(to_number(n) for n in ns),
    "merge": _merge,
    "min": lambda *ns: min(to_number(n) for n in ns),
    "modulo": lambda a, b: number(math.fmod(to_number(a), to_number(b))),
    "multiply": lambda a, b: number(to_number(a) * to_number(b)),
    "negate": lambda n: -to_number(n),
    "not": lambda b: not to_bool(b),
    "notequal": lambda a, b: not equal(a, b),
    "or": lambda a, b: to_bool(a) or to_bool(b),
    "parseint": _parseint,
    "pow": _pow,
    "range": _range,
    "reverse": lambda v: list(reversed(v)) if isinstance(v, list) else to_string(v)[::-1],
    "reverselist": lambda lst: list(reversed(as_list(lst, "reverselist"))),
    "sethaselement": lambda s, x: any(equal(y, x) for y in as_list(s, "sethaselement")),
    "setintersection": _setop("setintersection", lambda keys, k: all(k in s for s in keys)),
    "setproduct": _setproduct,
    "setsubtract": lambda a, b: [
        x
        for x in _distinct(as_list(a, "setsubtract"), "setsubtract")
        if not any(equal(x, y) for y in as_list(b, "setsubtract"))
    ],
    "setsymmetricdifference": _setop(
        "setsymmetricdifference", lambda keys, k: sum(k in s for s in keys) % 2 == 1
    ),
    "setunion": _setop("setunion", lambda keys, k: True),
    "signum": lambda n: (to_number(n) > 0) - (to_number(n) < 0),
    "slice": lambda lst, a, b: _slice(as_list(lst, "slice"), a, b),
    "sort": _sort,
    "subtract": lambda a, b: number(to_number(a) - to_number(b)),
    "values": lambda obj: [v for _, v in sorted(_dict(obj, "values").items())],
    "zipmap": lambda ks, vs: dict(
        zip((to_string(k) for k in as_list(ks, "zipmap")), as_list(vs, "zipmap"), strict=True)
    ),
}
