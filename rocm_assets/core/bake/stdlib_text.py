"""bake's string functions: text, Go-style format, RE2 regexes, encodings, hashes and UUIDs.

Semantics follow the Go implementations bake links (go-cty's stdlib, hashicorp/go-cty-funcs).
Regexes use RE2 (google-re2), as Go's regexp does: matching is linear in the input, so no
pattern can backtrack for minutes. Every function sizes its result before building it.
"""

import base64
import hashlib
import re
import unicodedata
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import re2

from rocm_assets.core.bake.errors import Unfollowed
from rocm_assets.core.bake.limits import MAX_COLLECTION, MAX_STRING, check_length, quote
from rocm_assets.core.bake.values import to_int, to_string, type_name

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
    if not lists:
        raise ValueError("join(): at least one list is required")
    items = []
    for lst in lists:
        for x in as_list(lst, "join"):
            if x is None:
                raise ValueError("join(): a list element must not be null")
            items.append(to_string(x))
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
    if count < 0:
        raise Unfollowed("indent() by a negative count")
    lines = text.split("\n")
    check_length(len(text) + count * (len(lines) - 1), "indent()", MAX_STRING, "characters")
    return ("\n" + " " * count).join(lines)


def _case(text: Value, fn: str, upper: bool) -> str:
    """Go's unicode.ToUpper/ToLower, one rune to one rune (Python's may make several)."""
    out = []
    for ch in to_string(text):
        mapped = ch.upper() if upper else ch.lower()
        if len(mapped) != 1:
            raise Unfollowed(f"{fn}() of {ch!r} (Go maps it to one character, Python to several)")
        out.append(mapped)
    return "".join(out)


def _go_separator(ch: str) -> bool:
    """strings.Title's isSeparator."""
    if ch.isascii():
        return not (ch.isalnum() or ch == "_")
    if unicodedata.category(ch)[0] in "LN":
        return False
    return ch.isspace()


def title(text: Value) -> str:
    """Go's strings.Title: upper-case each word's first letter, leave the rest as it is."""
    out, previous = [], " "
    for ch in to_string(text):
        if _go_separator(previous):
            mapped = ch.title() if not ch.isascii() else ch.upper()
            if len(mapped) != 1:
                raise Unfollowed(f"title() of {ch!r}")
            out.append(mapped)
        else:
            out.append(ch)
        previous = ch
    return "".join(out)


def sanitize(text: Value) -> str:
    """bake's sanitize: every character outside [a-zA-Z0-9_-] becomes `_`."""
    return "".join(
        ch if ch.isascii() and (ch.isalnum() or ch in "_-") else "_" for ch in to_string(text)
    )


# Characters that join their neighbours into one grapheme cluster (or may): combining marks,
# joiners, variation selectors, emoji modifiers, regional indicators, Hangul jamo, prepends.
_JOINING = re.compile(
    "[\u200c\u200d\ufe00-\ufe0f\U000e0000-\U000e0fff\U0001f1e6-\U0001f1ff"
    "\U0001f3fb-\U0001f3ff\u1100-\u11ff\ua960-\ua97f\ud7b0-\ud7ff\u0600-\u0605"
    "\u06dd\u070f\u08e2\U000110bd\U000110cd]"
)


def clusters(text: str, fn: str) -> list[str]:
    """The text's grapheme clusters, where each code point is one (refused otherwise)."""
    if (
        "\r\n" in text
        or _JOINING.search(text)
        or any(unicodedata.category(ch)[0] == "M" for ch in text if not ch.isascii())
    ):
        raise Unfollowed(f"{fn} of text whose grapheme clusters span several code points")
    return list(text)


def substr(text: Value, offset: Value, length: Value) -> str:
    """go-cty's substr, by grapheme cluster, quirks included (see the Go source)."""
    chars = clusters(to_string(text), "substr()")
    start, count = to_int(offset, "invalid offset"), to_int(length, "invalid length")
    if start < 0:
        start += len(chars)
    elif count == 0:
        return ""
    if start > 0:
        if start >= len(chars):
            return ""
        chars = chars[start:]
    if count <= 0:
        # A zero count is reached only after a negative offset: go-cty's loop then keeps all.
        return "".join(chars)
    return "".join(chars[:count])


def strlen(text: Value) -> int:
    return len(clusters(to_string(text), "strlen()"))


def reverse(text: Value) -> str:
    return "".join(reversed(clusters(to_string(text), "reverse()")))


# Go's unicode.IsSpace: Python's str.isspace also counts \x1c-\x1f.
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


def _go_base(path: str) -> str:
    """Go's path.Base."""
    if path == "":
        return "."
    path = path.rstrip("/")
    if path == "":
        return "/"
    return path[path.rfind("/") + 1 :]


def _go_clean(path: str) -> str:
    """Go's path.Clean."""
    if path == "":
        return "."
    rooted = path.startswith("/")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
            continue
        parts.append(part)
    cleaned = ("/" if rooted else "") + "/".join(parts)
    return cleaned or ("/" if rooted else ".")


def _go_dir(path: str) -> str:
    """Go's path.Dir."""
    return _go_clean(path[: path.rfind("/") + 1])


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
    "basename": lambda s: _go_base(to_string(s)),
    "chomp": lambda s: to_string(s).rstrip("\r\n"),
    "dirname": lambda s: _go_dir(to_string(s)),
    "indent": indent,
    "join": join,
    "lower": lambda s: _case(s, "lower", upper=False),
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
    "reverse": reverse,
    "strlen": strlen,
    "substr": substr,
    "title": title,
    "trim": lambda s, cut: to_string(s).strip(to_string(cut)),
    "trimprefix": lambda s, p: to_string(s).removeprefix(to_string(p)),
    "trimspace": lambda s: to_string(s).strip(_GO_SPACE),
    "trimsuffix": lambda s, p: to_string(s).removesuffix(to_string(p)),
    "upper": lambda s: _case(s, "upper", upper=True),
    "urlencode": urlencode,
    "uuidv5": uuidv5,
}
