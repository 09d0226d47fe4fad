"""Bake values in Python, and go-cty's conversions between them.

A value is a str, bool, `Num` (a go-cty number, see `ctynum`), None, list (HCL tuples, lists and
sets) or dict (objects and maps) with str keys. Strings are NFC-normalised as go-cty normalises
every string it makes.
"""

import unicodedata
from typing import Any

from rocm_assets.core.bake import ctynum
from rocm_assets.core.bake.ctynum import Num
from rocm_assets.core.bake.errors import Unfollowed
from rocm_assets.core.bake.limits import MAX_COLLECTION, expanded_size, quote

Value = Any

# What Go's strconv.ParseBool reads, as bake applies it to an env override of a bool variable.
PARSE_BOOL_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
PARSE_BOOL_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def text(value: str) -> str:
    """A string as go-cty holds it (cty.StringVal normalises to NFC)."""
    return value if value.isascii() else unicodedata.normalize("NFC", value)


# NumberIntVal of the indexes and lengths most files use, made once (a Num never changes).
_SMALL = [ctynum.from_int(i, ctynum.INT64_PREC) for i in range(1024)]


def number(value: int) -> Num:
    """An integer a function computed, as go-cty's NumberIntVal makes it (64 bits)."""
    if 0 <= value < len(_SMALL):
        return _SMALL[value]
    return ctynum.from_int(value, ctynum.INT64_PREC)


class CtySet(list):
    """A go-cty set: its elements in cty's order (see `stdlib_sets`); it cannot be indexed."""


def iteration(collection: Value) -> list[tuple[Value, Value]]:
    """What a `for` iterates: a list's (index, element), an object's (key, value) by key, a
    set's (element, element)."""
    if isinstance(collection, CtySet):
        return [(item, item) for item in collection]
    if isinstance(collection, dict):
        return sorted(collection.items())
    if isinstance(collection, list):
        return [(number(i), item) for i, item in enumerate(collection)]
    raise ValueError(f"cannot iterate over a {type_name(collection)}")


def to_string(value: Value) -> str:
    """Convert a primitive the way go-cty does for interpolation and string arguments."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, Num):
        return value.text()
    if value is None:
        raise ValueError("a null value cannot be used as a string")
    raise ValueError(f"a {type_name(value)} cannot be used as a string")


def to_number(value: Value) -> Num:
    """go-cty's conversion to a number: a string is parsed as a 512-bit decimal."""
    if isinstance(value, Num):
        return value
    if isinstance(value, str):
        try:
            return ctynum.literal(value)
        except ctynum.NumberError:
            raise ValueError(f"a number is required, not {quote(value)}") from None
    raise ValueError(f"a number is required, not a {type_name(value)}")


def to_int(value: Value, what: str) -> int:
    """A whole number, as go-cty converts one to a Go int for indexes, counts and offsets."""
    try:
        return ctynum.to_int64(to_number(value))
    except ctynum.NumberError as exc:
        raise ValueError(f"{what}: {exc}") from None


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
    raise ValueError(f"incorrect condition type: {quote(value)} is not a bool")


def type_name(value: Value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Num):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "tuple"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


# Go's encoding/json escapes these besides quotes, backslashes and control characters.
_JSON_ESCAPES = {
    '"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t",
    "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029",
}  # fmt: skip


def _json_string(value: str) -> str:
    out = []
    for ch in value:
        if ch in _JSON_ESCAPES:
            out.append(_JSON_ESCAPES[ch])
        elif ch in "\b\f":
            # Go 1.22 writes \b and \f, older releases \u0008 and \u000c: bakes differ.
            raise Unfollowed("jsonencode() of a backspace or form feed")
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def to_json(value: Value) -> str:
    """A value as cty/json writes it: compact, keys sorted, numbers as bake prints them."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Num):
        return value.text()
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, list):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ",".join(f"{_json_string(k)}:{to_json(v)}" for k, v in items) + "}"
    raise ValueError(f"a {type_name(value)} cannot be written as JSON")


def canonical(value: Value, what: str) -> str:
    """One string per distinct value (type included), for comparing and deduplicating."""
    if isinstance(value, Num):
        return f"number:{value.text() if not value.is_int() else int(value.value)}"
    if not isinstance(value, list | dict):
        return f"{type_name(value)}:{value!r}"
    expanded_size(value, MAX_COLLECTION, what)
    return to_json(value)


def equal(left: Value, right: Value) -> bool:
    """go-cty equality: no conversion, so the bool true never equals the string "true"."""
    if isinstance(left, Num) and isinstance(right, Num):
        return ctynum.equal(left, right)
    if isinstance(left, list | dict) or isinstance(right, list | dict):
        return canonical(left, "==") == canonical(right, "==")
    return type_name(left) == type_name(right) and left == right
