"""Bake values in Python, and go-cty's conversions between them.

A value is a str, bool, int, float, None, list (HCL tuples, lists and sets) or dict (objects and
maps) with str keys. Numbers are Python ints while exact, floats otherwise; bake's are 512-bit
big floats, so a number beyond a double's range (about 1.8e308) is refused here rather than
rounded differently.
"""

import json
import math
import re
from decimal import Decimal
from typing import Any

from rocm_assets.core.bake.limits import MAX_COLLECTION, expanded_size, quote

Value = Any

# What Go's strconv.ParseBool reads, as bake applies it to an env override of a bool variable.
PARSE_BOOL_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
PARSE_BOOL_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})

# A decimal number as HCL and Go's ParseFloat write it (no NaN, Inf, hex or underscores).
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_MAX_INT = 1 << 1024
_EXACT_FLOAT = 1 << 53


def number(value: int | float) -> int | float:
    """A number as the evaluator keeps it; out of a double's range is an error."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("number out of range (beyond about ±1.8e308)")
        return int(value) if value.is_integer() and abs(value) < _EXACT_FLOAT else value
    if abs(value) >= _MAX_INT:
        raise ValueError("number out of range (beyond about ±1.8e308)")
    return value


def parse_number(text: str) -> int | float:
    """A number written in decimal, as in the file or an env override."""
    text = text.strip()
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"{quote(text)} is not a number")
    if re.fullmatch(r"[+-]?\d+", text) and len(text) < 300:
        return number(int(text))
    try:
        return number(float(text))
    except OverflowError:
        raise ValueError(f"{quote(text)}: number out of range") from None


def to_string(value: Value) -> str:
    """Convert a primitive the way go-cty does for interpolation and string arguments."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # cty prints the shortest exact decimal, never an exponent: 1e+20 is 100000000000000000000.
        return format(Decimal(repr(value)), "f")
    if value is None:
        raise ValueError("a null value cannot be used as a string")
    raise ValueError(f"a {type_name(value)} cannot be used as a string")


def to_number(value: Value) -> int | float:
    if isinstance(value, bool):
        raise ValueError("a bool cannot be used as a number")
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        return parse_number(value)
    raise ValueError(f"a {type_name(value)} cannot be used as a number")


def to_int(value: Value, what: str) -> int:
    """A whole number, as cty wants for indexes, counts and offsets."""
    n = to_number(value)
    if isinstance(n, float):
        raise ValueError(f"{what} must be a whole number, not {quote(n)}")
    return n


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
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "tuple"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def canonical(value: Value, what: str) -> str:
    """One string per distinct value (type included), for comparing and deduplicating."""
    if not isinstance(value, list | dict):
        return f"{type_name(value)}:{value!r}"
    expanded_size(value, MAX_COLLECTION, what)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def equal(left: Value, right: Value) -> bool:
    """go-cty equality: no conversion, so the bool true never equals the string "true"."""
    if isinstance(left, list | dict) or isinstance(right, list | dict):
        return canonical(left, "==") == canonical(right, "==")
    return type_name(left) == type_name(right) and left == right
