"""go-cty's format() and formatlist(): Go fmt verbs over go-cty values.

The verb grammar is go-cty's (format_fsm.rl): `%[flags][width][.precision]verb`, flags `+ - # 0`
and space, a width not starting with 0. Numbers format as Go formats a big.Float or big.Int
(%f rounds the exact value half to even, %v is Text('g', -1)); strings pad and cut by grapheme
cluster, followed here where each code point is its own cluster.
"""

import re
from dataclasses import dataclass
from typing import Any

from rocm_assets.core.bake import ctynum
from rocm_assets.core.bake.ctynum import Num
from rocm_assets.core.bake.errors import Unfollowed
from rocm_assets.core.bake.limits import MAX_STRING, check_length
from rocm_assets.core.bake.stdlib_text import clusters
from rocm_assets.core.bake.values import to_bool, to_json, to_number, to_string

Value = Any

_VERB = re.compile(r"%([-+# 0]*)([1-9][0-9]*)?(?:\.([0-9]*))?(\[[0-9]*\])?([A-Za-z])?")
# Go fmt has no bound; this one keeps a format string from asking for megabytes of padding.
_MAX_WIDTH = 10_000
_BASES = {"b": 2, "o": 8, "d": 10, "x": 16, "X": 16}


@dataclass(frozen=True)
class _Verb:
    flags: str
    width: int | None
    prec: int | None
    mode: str
    raw: str
    offset: int

    def pad(self, text: str, char: str = " ") -> str:
        """go-cty's formatPadWidth: pad to the width in grapheme clusters."""
        if self.width is None:
            return text
        missing = self.width - len(clusters(text, "format()"))
        if missing <= 0:
            return text
        fill = ("0" if "0" in self.flags else char) * missing
        return text + fill if "-" in self.flags else fill + text


def format_(spec: Value, *args: Value) -> str:
    fmt, out, size = to_string(spec), [], 0
    next_arg, highest, i = 0, 0, 0
    while i < len(fmt):
        ch = fmt[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        if fmt.startswith("%%", i):
            out.append("%")
            i += 2
            continue
        match = _VERB.match(fmt, i)
        assert match is not None  # the pattern matches any "%"
        flags, width, prec, index, mode = match.groups()
        if index is not None:
            raise Unfollowed("format() with an explicit argument index")
        if mode is None:
            end = match.end()
            if end >= len(fmt):
                raise ValueError(f"format(): invalid format string starting at offset {end}")
            raise ValueError(
                f"format(): unrecognized format character {fmt[end]!r} at offset {end}"
            )
        sizes = [int(n) for n in (width, prec) if n]
        if any(n > _MAX_WIDTH for n in sizes):
            raise ValueError(f"format(): width or precision over {_MAX_WIDTH}")
        verb = _Verb(
            flags,
            int(width) if width else None,
            (int(prec) if prec else 0) if prec is not None else None,
            mode,
            match.group(0),
            i,
        )
        if next_arg >= len(args):
            raise ValueError(
                f"format(): not enough arguments for {verb.raw!r} at {i}: need index "
                f"{next_arg + 1} but have {len(args)} total"
            )
        piece = _append(verb, args[next_arg])
        next_arg += 1
        highest = max(highest, next_arg)
        size += len(piece)
        check_length(size, "format()", MAX_STRING, "characters")
        out.append(piece)
        i = match.end()
    if highest < len(args):
        raise ValueError("format(): too many arguments for the format string")
    return "".join(out)


def _append(verb: _Verb, arg: Value) -> str:
    if verb.mode != "v" and arg is None:
        raise ValueError(f"format(): null value cannot be formatted by {verb.raw!r}")
    if verb.mode == "v":
        if "#" not in verb.flags and isinstance(arg, str):
            return verb.pad(arg)
        if "#" not in verb.flags and isinstance(arg, Num):
            return verb.pad(ctynum.text_g(arg))
        return verb.pad(to_json(arg))
    if verb.mode == "t":
        return "true" if to_bool(arg) else "false"
    if verb.mode in _BASES:
        return _integer(verb, to_number(arg))
    if verb.mode == "f":
        return _float(verb, to_number(arg))
    if verb.mode in "eEgG":
        raise Unfollowed(f"format() verb %{verb.mode}")
    if verb.mode in "sq":
        if isinstance(arg, list | dict):
            raise ValueError(f"format(): unsupported value for {verb.raw!r}: string required")
        text = to_string(arg)
        if verb.prec is not None and verb.prec > 0:
            text = "".join(clusters(text, "format()")[: verb.prec])
        return verb.pad(to_json(text) if verb.mode == "q" else text)
    raise ValueError(f"format(): unsupported format verb {verb.mode!r} in {verb.raw!r}")


def _integer(verb: _Verb, num: Num) -> str:
    """Go's big.Int Format, as format() writes %b %d %o %x %X."""
    if not num.is_int():
        raise ValueError(f"format(): unsupported value for {verb.raw!r}: an integer is required")
    value = int(num.value)
    base = _BASES[verb.mode]
    digits = _in_base(abs(value), base)
    digits = digits.upper() if verb.mode == "X" else digits
    sign = "-" if value < 0 else "+" if "+" in verb.flags else " " if " " in verb.flags else ""
    prefix = ""
    if "#" in verb.flags:
        prefix = {"b": "0b", "o": "0", "x": "0x", "X": "0X"}.get(verb.mode, "")
    zeros = 0
    if verb.prec is not None:
        if len(digits) < verb.prec:
            zeros = verb.prec - len(digits)
        elif digits == "0" and verb.prec == 0:
            return ""
    left = right = 0
    length = len(sign) + len(prefix) + zeros + len(digits)
    if verb.width is not None and length < verb.width:
        missing = verb.width - length
        if "-" in verb.flags:
            right = missing
        elif "0" in verb.flags and verb.prec is None:
            zeros = missing
        else:
            left = missing
    return " " * left + sign + prefix + "0" * zeros + digits + " " * right


def _in_base(value: int, base: int) -> str:
    if base == 10:
        return str(value)
    return format(value, {2: "b", 8: "o", 16: "x"}[base])


def _float(verb: _Verb, num: Num) -> str:
    """Go's big.Float Format for %f: the exact value rounded, sign and padding as Go does."""
    body = ctynum.fixed(num, 6 if verb.prec is None else verb.prec)
    sign = "-" if num.negative else "+" if "+" in verb.flags else " " if " " in verb.flags else ""
    missing = (verb.width or 0) - len(sign) - len(body)
    if missing <= 0:
        return sign + body
    if "0" in verb.flags:
        return sign + "0" * missing + body
    if "-" in verb.flags:
        return sign + body + " " * missing
    return " " * missing + sign + body


def formatlist(spec: Value, *args: Value) -> list:
    lists = [a for a in args if isinstance(a, list)]
    lengths = {len(a) for a in lists}
    if len(lengths) > 1:
        raise ValueError("formatlist(): all list arguments must have the same length")
    count = lengths.pop() if lengths else 1
    return [
        format_(spec, *[a[i] if isinstance(a, list) else a for a in args]) for i in range(count)
    ]


FORMAT_FUNCTIONS = {"format": format_, "formatlist": formatlist}
