"""How an error message quotes what it was given: one line, printable, short, whatever the input.

Files and servers are input: a value quoted in an error must never cost what the value costs
(a megabyte tag, an alias bomb), nor break the one-line rule, nor carry terminal escapes.
"""

from typing import Any

_KINDS = {dict: "a mapping", list: "a list", tuple: "a list", set: "a set", frozenset: "a set"}


def one_line(text: str) -> str:
    return " ".join(text.split())


def bounded(text: str, limit: int = 200) -> str:
    """`text` on one line, printable, at most `limit` characters: safe to put in an error."""
    clean = "".join(c if c.isprintable() else " " for c in text[: limit * 2])
    line = one_line(clean)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def shown(value: object) -> str:
    """A value as an error message quotes it: repr for strings, at most 60 characters.

    A container is named by its kind only: what it holds may be anything, a credential under a
    key nobody asked for included.
    """
    # Only a prefix is ever rendered: str() of a huge value would cost what the value costs.
    if isinstance(value, str):
        text = repr(value[:61])
    elif type(value) in _KINDS:
        text = _KINDS[type(value)]
    else:
        text = one_line(str(value)[:61])
    return text if len(text) <= 60 else text[:57] + "..."


def quote(value: Any, limit: int = 60) -> str:
    """A short rendering of a value for an error message: never the whole of a large value."""
    if isinstance(value, str):
        text = repr(value[: limit + 1])
        return text if len(value) <= limit else f"{text[:-1]}...{text[-1]}"
    if isinstance(value, list):
        return f"a list of {len(value)} elements"
    if isinstance(value, dict):
        return f"an object of {len(value)} attributes"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
