"""bake's string functions: text, Go-style format, RE2 regexes, encodings, hashes and UUIDs.

Semantics follow the Go implementations bake links (go-cty's stdlib, hashicorp/go-cty-funcs).
Regexes use RE2 (google-re2), as Go's regexp does: matching is linear in the input, so no
pattern can backtrack for minutes. Every function sizes its result before building it.
"""

import base64
import hashlib
import json
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import re2

from rocm_assets.core.bake.limits import MAX_COLLECTION, MAX_STRING, check_length, quote
from rocm_assets.core.bake.values import to_int, to_number, to_string, type_name

Value = Any

# Go fmt has no bound; this one keeps a format string from asking for megabytes of padding.
_MAX_WIDTH = 10_000
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the error comes back as our message, not on stderr


def _regex(pattern: Value) -> Any:
    try:
        return re2.compile(to_string(pattern), _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args else "invalid"
        raise ValueError(
            f"invalid regular expression {quote(to_string(pattern))}: {reason}"
        ) from None


def _matches(compiled: Any, text: str) -> Iterator[Any]:
    """Go's regexp allMatches: successive matches, no empty match right after a match."""
    pos, prev_end, count = 0, -1, 0
    while pos <= len(text):
        match = compiled.search(text, pos)
        if match is None:
            return
        start, end = match.span()
        accept = not (end == start == prev_end)
        pos = pos + 1 if end == pos else end
        prev_end = end
        if accept:
            count += 1
            check_length(count, "this regex", MAX_COLLECTION, "matches")
            yield match


def _capture(compiled: Any, match: Any) -> Value:
    """regex()'s result shape: the match, a list of groups, or an object of named groups."""
    if compiled.groups == 0:
        return match.group(0)
    names = compiled.groupindex
    if names and len(names) != compiled.groups:
        raise ValueError("named and unnamed capture groups cannot be mixed in one pattern")
    if names:
        return {name: match.group(i) for name, i in names.items()}
    return [match.group(i) for i in range(1, compiled.groups + 1)]


def regex(pattern: Value, text: Value) -> Value:
    compiled = _regex(pattern)
    match = compiled.search(to_string(text))
    if match is None:
        raise ValueError("pattern did not match any part of the given string")
    return _capture(compiled, match)


def regexall(pattern: Value, text: Value) -> list:
    compiled = _regex(pattern)
    return [_capture(compiled, m) for m in _matches(compiled, to_string(text))]


def _expand(template: str, match: Any, names: dict[str, int]) -> str:
    """Go's Regexp.Expand: $1, ${1}, $name, ${name}; $$ is a dollar; unknown groups are empty."""
    out: list[str] = []
    i = 0
    while i < len(template):
        ch = template[i]
        if ch != "$" or i + 1 >= len(template):
            out.append(ch)
            i += 1
            continue
        if template[i + 1] == "$":
            out.append("$")
            i += 2
            continue
        if template[i + 1] == "{":
            close = template.find("}", i + 2)
            name = template[i + 2 : close] if close > 0 else ""
            rest = close + 1
        else:
            j = i + 1
            while j < len(template) and (template[j].isalnum() or template[j] == "_"):
                j += 1
            name, rest = template[i + 1 : j], j
        if not name or not all(c.isalnum() or c == "_" for c in name):
            out.append("$")  # malformed: Go keeps the dollar as text
            i += 1
            continue
        index = int(name) if name.isdigit() else names.get(name, -1)
        if 0 <= index <= match.re.groups:
            out.append(match.group(index) or "")
        i = rest
    return "".join(out)


def regex_replace(text: Value, pattern: Value, replacement: Value) -> str:
    compiled, text, replacement = _regex(pattern), to_string(text), to_string(replacement)
    out: list[str] = []
    size, last = 0, 0
    for match in _matches(compiled, text):
        start, end = match.span()
        piece = _expand(replacement, match, compiled.groupindex)
        size += (start - last) + len(piece)
        check_length(size, "regex_replace()", MAX_STRING, "characters")
        out.append(text[last:start])
        out.append(piece)
        last = end
    check_length(size + len(text) - last, "regex_replace()", MAX_STRING, "characters")
    out.append(text[last:])
    return "".join(out)


def replace(text: Value, old: Value, new: Value) -> str:
    """go-cty's replace: plain substrings (bake has no /regex/ form; that is Terraform's)."""
    text, old, new = to_string(text), to_string(old), to_string(new)
    count = len(text) + 1 if old == "" else text.count(old)
    check_length(len(text) + count * (len(new) - len(old)), "replace()", MAX_STRING, "characters")
    return text.replace(old, new)


def join(separator: Value, *lists: Value) -> str:
    items = [to_string(x) for lst in lists for x in as_list(lst, "join")]
    sep = to_string(separator)
    size = sum(map(len, items)) + len(sep) * max(len(items) - 1, 0)
    check_length(size, "join()", MAX_STRING, "characters")
    return sep.join(items)


def split(separator: Value, text: Value) -> list:
    sep, text = to_string(separator), to_string(text)
    if sep == "":
        check_length(len(text), "split()", MAX_COLLECTION, "elements")
        return list(text)
    check_length(text.count(sep) + 1, "split()", MAX_COLLECTION, "elements")
    return text.split(sep)


def indent(spaces: Value, text: Value) -> str:
    """go-cty's indent: every line but the first gets `spaces` spaces."""
    count, text = to_int(spaces, "indent()'s spaces"), to_string(text)
    lines = text.split("\n")
    check_length(len(text) + max(count, 0) * (len(lines) - 1), "indent()", MAX_STRING, "characters")
    return ("\n" + " " * max(count, 0)).join(lines)


def title(text: Value) -> str:
    """Go's strings.Title: upper-case each word's first letter, leave the rest as it is."""
    out, previous = [], " "
    for ch in to_string(text):
        out.append(ch.upper() if not (previous.isalnum() or previous == "_") else ch)
        previous = ch
    return "".join(out)


def sanitize(text: Value) -> str:
    """bake's sanitize: every character outside [a-zA-Z0-9_-] becomes `_`."""
    return "".join(
        ch if ch.isascii() and (ch.isalnum() or ch in "_-") else "_" for ch in to_string(text)
    )


def substr(text: Value, offset: Value, length: Value) -> str:
    text = to_string(text)
    start, count = to_int(offset, "substr()'s offset"), to_int(length, "substr()'s length")
    if start < 0:
        start += len(text)
    if not 0 <= start <= len(text):
        raise ValueError("substr()'s offset is outside the string")
    return text[start:] if count < 0 else text[start : start + count]


def format_(spec: Value, *args: Value) -> str:
    """go-cty's format: Go's fmt verbs %s %v %q %d %f %e %g %x %X %o %b %t %%, width, precision."""
    fmt, out, size = to_string(spec), [], 0
    it = iter(args)
    i = 0
    while i < len(fmt):
        ch = fmt[i]
        if ch != "%":
            out.append(ch)
            size += 1
            i += 1
            continue
        j = i + 1
        while j < len(fmt) and fmt[j] in "+- 0#":
            j += 1
        while j < len(fmt) and (fmt[j].isdigit() or fmt[j] == "."):
            j += 1
        if j >= len(fmt):
            raise ValueError("format(): the format string ends inside a verb")
        flags_width, verb = fmt[i + 1 : j], fmt[j]
        i = j + 1
        if verb == "%":
            out.append("%")
            size += 1
            continue
        try:
            arg = next(it)
        except StopIteration:
            raise ValueError("format(): not enough arguments for the format string") from None
        piece = _verb(verb, flags_width, arg)
        size += len(piece)
        check_length(size, "format()", MAX_STRING, "characters")
        out.append(piece)
    if next(it, None) is not None:
        raise ValueError("format(): too many arguments for the format string")
    return "".join(out)


def _verb(verb: str, flags_width: str, arg: Value) -> str:
    sizes = [int(n) for n in flags_width.lstrip("+- 0#").split(".") if n]
    if any(n > _MAX_WIDTH for n in sizes):
        raise ValueError(f"format(): width or precision over {_MAX_WIDTH}")
    if verb in "sv":
        text = json.dumps(arg) if isinstance(arg, list | dict) else to_string(arg)
        return f"%{flags_width}s" % text
    if verb == "q":
        return f"%{flags_width}s" % json.dumps(to_string(arg), ensure_ascii=False)
    if verb == "t":
        if not isinstance(arg, bool):
            raise ValueError(f"format(): %t needs a bool, got {type_name(arg)}")
        return f"%{flags_width}s" % to_string(arg)
    if verb in "dxXob":
        n = to_int(arg, f"format()'s %{verb} argument")
        if verb == "b":
            return f"%{flags_width.replace('#', '')}s" % (
                ("-" if n < 0 else "") + format(abs(n), "b")
            )
        return f"%{flags_width}{verb}" % n
    if verb in "feEgG":
        return f"%{flags_width}{verb}" % to_number(arg)
    raise ValueError(f"format(): unsupported verb %{verb}")


def formatlist(spec: Value, *args: Value) -> list:
    lists = [a for a in args if isinstance(a, list)]
    lengths = {len(a) for a in lists}
    if len(lengths) > 1:
        raise ValueError("formatlist(): all list arguments must have the same length")
    count = lengths.pop() if lengths else 1
    return [
        format_(spec, *[a[i] if isinstance(a, list) else a for a in args]) for i in range(count)
    ]


def as_list(value: Value, fn: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{fn}() wants a list, got {type_name(value)}")
    return value


def base64decode(text: Value) -> str:
    try:
        return base64.b64decode(to_string(text), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        raise ValueError("base64decode(): not valid base64 of UTF-8 text") from None


def urlencode(text: Value) -> str:
    """Go's url.QueryEscape: spaces become +, everything but [A-Za-z0-9_.~-] is %XX."""
    return urllib.parse.quote_plus(to_string(text), safe="")


def _digest(name: str) -> Any:
    return lambda text: hashlib.new(name, to_string(text).encode()).hexdigest()


_UUID_NAMESPACES = {
    "dns": uuid.NAMESPACE_DNS,
    "url": uuid.NAMESPACE_URL,
    "oid": uuid.NAMESPACE_OID,
    "x500": uuid.NAMESPACE_X500,
}


def uuidv5(namespace: Value, name: Value) -> str:
    ns = to_string(namespace)
    try:
        space = _UUID_NAMESPACES.get(ns) or uuid.UUID(ns)
    except ValueError:
        raise ValueError(f"uuidv5(): {quote(ns)} is not dns, url, oid, x500 or a UUID") from None
    return str(uuid.uuid5(space, to_string(name)))


TEXT_FUNCTIONS = {
    "base64decode": base64decode,
    "base64encode": lambda s: base64.b64encode(to_string(s).encode()).decode(),
    "chomp": lambda s: to_string(s).rstrip("\r\n"),
    "format": format_,
    "formatlist": formatlist,
    "indent": indent,
    "join": join,
    "lower": lambda s: to_string(s).lower(),
    "md5": _digest("md5"),
    "regex": regex,
    "regex_replace": regex_replace,
    "regexall": regexall,
    "replace": replace,
    "sanitize": sanitize,
    "sha1": _digest("sha1"),
    "sha256": _digest("sha256"),
    "sha512": _digest("sha512"),
    "split": split,
    "strlen": lambda s: len(to_string(s)),
    "substr": substr,
    "title": title,
    "trim": lambda s, cut: to_string(s).strip(to_string(cut)),
    "trimprefix": lambda s, p: to_string(s).removeprefix(to_string(p)),
    "trimspace": lambda s: to_string(s).strip(),
    "trimsuffix": lambda s, p: to_string(s).removesuffix(to_string(p)),
    "upper": lambda s: to_string(s).upper(),
    "urlencode": urlencode,
    "uuidv4": lambda: str(uuid.uuid4()),
    "uuidv5": uuidv5,
}
