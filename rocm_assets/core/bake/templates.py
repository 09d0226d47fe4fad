"""HCL string templates: escapes, interpolation, `%{if}`/`%{for}` directives and heredocs.

Quoted strings take HCL's escapes (`\\n \\r \\t \\" \\\\ \\uNNNN \\UNNNNNNNN`, `$${`, `%%{`); any
other backslash sequence is an error, as in HCL. Heredocs take no backslash escapes. A template
is sized as it is built, so no interpolation loop can build more than the string limit.
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hcl2.rules import directives as D, strings as S

from rocm_assets.core.bake.limits import MAX_STRING, check_length, quote
from rocm_assets.core.bake.values import to_bool, to_string, type_name

if TYPE_CHECKING:
    from rocm_assets.core.bake.evaluate import Evaluation

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
_HEX = frozenset("0123456789abcdefABCDEF")


def unescape(text: str) -> str:
    """A quoted string's literal text; ValueError names a bad escape."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if text.startswith(("$${", "%%{"), i):
            out.append(text[i + 1 : i + 3])
            i += 3
        elif ch == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt in ("u", "U"):
                digits = 4 if nxt == "u" else 8
                code = text[i + 2 : i + 2 + digits]
                if len(code) != digits or not set(code) <= _HEX:
                    raise ValueError(
                        f"invalid escape {quote(text[i : i + 2 + digits])}: \\{nxt} takes "
                        f"exactly {digits} hex digits"
                    )
                value = int(code, 16)
                if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
                    raise ValueError(f"invalid escape \\{nxt}{code}: not a Unicode character")
                out.append(chr(value))
                i += 2 + digits
            elif nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
            else:
                raise ValueError(f"invalid escape {quote(text[i : i + 2])} in a quoted string")
        else:
            out.append(ch)
            i += 1
    return "".join(out)


class _Text:
    """A string under construction that refuses to grow past the string limit."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0

    def add(self, piece: str) -> None:
        self.size += len(piece)
        check_length(self.size, "this template", MAX_STRING, "characters")
        self.parts.append(piece)

    def text(self) -> str:
        return "".join(self.parts)


def template(ev: "Evaluation", parts: Any, scope: Mapping[str, Any]) -> str:
    out = _Text()
    for part in parts:
        _part(ev, part, scope, out)
    return out.text()


def _part(ev: "Evaluation", part: Any, scope: Mapping[str, Any], out: _Text) -> None:
    content = part.content if isinstance(part, S.StringPartRule) else part
    if isinstance(content, S.InterpolationRule):
        value = ev.expr(content.expression, scope)
        try:
            out.add(to_string(value))
        except ValueError as exc:
            raise ev.error(f"interpolation: {exc}", part) from None
    elif isinstance(content, D.TemplateIfRule):
        _if(ev, content, scope, out)
    elif isinstance(content, D.TemplateForRule):
        _for(ev, content, scope, out)
    elif isinstance(part, S.StringPartRule):
        try:
            out.add(unescape(str(content.value)))
        except ValueError as exc:
            raise ev.error(str(exc), part) from None
    else:
        raise ev.error(f"unsupported string part {type(part).__name__}", part)


def _if(ev: "Evaluation", rule: Any, scope: Mapping[str, Any], out: _Text) -> None:
    children = [c for c in rule.children if c is not None]
    body: list[Any] = []
    otherwise: list[Any] = []
    current = body
    for child in children[1:]:
        if isinstance(child, D.TemplateElseRule):
            current = otherwise
        elif not isinstance(child, D.TemplateEndifRule):
            current.append(child)
    condition = ev.expr(children[0].condition, scope)
    try:
        chosen = body if to_bool(condition) else otherwise
    except ValueError as exc:
        raise ev.error(str(exc), rule) from None
    for part in chosen:
        _part(ev, part, scope, out)


def _for(ev: "Evaluation", rule: Any, scope: Mapping[str, Any], out: _Text) -> None:
    children = [c for c in rule.children if c is not None]
    start = children[0]
    collection = ev.expr(start.collection, scope)
    if isinstance(collection, dict):
        items = list(collection.items())
    elif isinstance(collection, list):
        items = list(enumerate(collection))
    else:
        raise ev.error(f"%{{for}} cannot iterate over a {type_name(collection)}", rule)
    body = [c for c in children[1:] if not isinstance(c, D.TemplateEndforRule)]
    value_name = start.iterator.serialize()
    key_name = start.key_iterator.serialize() if start.key_iterator else None
    for key, item in items:
        local = {**scope, value_name: item, **({key_name: key} if key_name else {})}
        for part in body:
            _part(ev, part, local, out)


def heredoc(ev: "Evaluation", rule: Any, scope: Mapping[str, Any]) -> str:
    """A heredoc, read as a template when the file was parsed (see `parse.heredoc_template`)."""
    return ev.expr(ev.bake.heredocs[id(rule)][1], scope)
