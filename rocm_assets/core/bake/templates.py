"""HCL string templates: escapes, interpolation, `%{if}`/`%{for}` directives and heredocs.

Quoted strings take HCL's escapes (`\\n \\r \\t \\" \\\\ \\uNNNN \\UNNNNNNNN`, `$${`, `%%{`); any
other backslash sequence is an error, as in HCL. Heredocs take no backslash escapes. A template
is sized as it is built, so no interpolation loop can build more than the string limit.

A directive's strip markers (`%{~ ... ~}`) trim the whitespace of the literal text right beside
it, as HCL's template parser does on its tokens (before anything is evaluated): so a template is
first flattened into tokens, trimmed, and nested again (`_compile`, once per template).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hcl2.rules import directives as D, strings as S

from rocm_assets.core.bake.errors import Unfollowed
from rocm_assets.core.bake.evaluator import Evaluator
from rocm_assets.core.bake.limits import MAX_STRING, check_length, quote
from rocm_assets.core.bake.values import iteration, text, to_bool, to_string, type_name

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
_HEX = frozenset("0123456789abcdefABCDEF")
# Go's unicode.IsSpace, which HCL trims by (Python's str.isspace also counts \x1c-\x1f).
GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)


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


# ---- compiling: tokens, trimmed, nested again ----
@dataclass
class _Literal:
    text: str
    rule: Any


@dataclass
class _Interp:
    rule: Any


@dataclass
class _If:
    start: Any
    then: list = field(default_factory=list)
    otherwise: list = field(default_factory=list)


@dataclass
class _For:
    start: Any
    body: list = field(default_factory=list)


def _tokens(ev: Evaluator, parts: Any, out: list) -> None:
    """Flatten python-hcl2's nested parts into HCL's token order."""
    for part in parts:
        if part is None:
            continue
        content = part.content if isinstance(part, S.StringPartRule) else part
        if isinstance(content, S.InterpolationRule):
            out.append(_Interp(content.expression))
        elif isinstance(content, D.TemplateIfRule | D.TemplateForRule):
            _tokens(ev, [c for c in content.children if c is not None], out)
        elif isinstance(
            content,
            D.TemplateIfStartRule | D.TemplateElseRule | D.TemplateEndifRule
            | D.TemplateForStartRule | D.TemplateEndforRule,
        ):  # fmt: skip
            out.append(content)
        elif isinstance(part, S.StringPartRule):
            try:
                text = unescape(str(content.value))
            except ValueError as exc:
                raise ev.error(str(exc), part) from None
            if out and isinstance(out[-1], _Literal):
                out[-1].text += text  # one literal run is one HCL token
            else:
                out.append(_Literal(text, part))
        else:
            raise Unfollowed(f"the template part {type(part).__name__}")


def _trim(tokens: list) -> None:
    for i, token in enumerate(tokens):
        if isinstance(token, _Literal | _Interp):
            continue
        if token.strip_open and i > 0 and isinstance(tokens[i - 1], _Literal):
            tokens[i - 1].text = tokens[i - 1].text.rstrip(GO_SPACE)
        if token.strip_close and i + 1 < len(tokens) and isinstance(tokens[i + 1], _Literal):
            tokens[i + 1].text = tokens[i + 1].text.lstrip(GO_SPACE)


def _nest(tokens: list) -> list:
    root: list = []
    stack: list[tuple[Any, list]] = [(None, root)]
    for token in tokens:
        node, current = stack[-1]
        if isinstance(token, D.TemplateIfStartRule):
            made = _If(token)
            current.append(made)
            stack.append((made, made.then))
        elif isinstance(token, D.TemplateForStartRule):
            made_for = _For(token)
            current.append(made_for)
            stack.append((made_for, made_for.body))
        elif isinstance(token, D.TemplateElseRule):
            stack[-1] = (node, node.otherwise)
        elif isinstance(token, D.TemplateEndifRule | D.TemplateEndforRule):
            stack.pop()
        else:
            current.append(token)
    return root


def _compile(ev: Evaluator, rule: Any, parts: Any) -> list:
    cached = ev.templates.get(id(rule))
    if cached is None:
        tokens: list = []
        _tokens(ev, list(parts), tokens)
        _trim(tokens)
        cached = ev.templates[id(rule)] = (rule, _nest(tokens))  # the rule keeps its id
    return cached[1]


# ---- evaluating ----
def template(ev: Evaluator, rule: Any, parts: Any, scope: Mapping[str, Any]) -> Any:
    """The value of `rule`, a template made of `parts`: its text, or, for a template that is one
    interpolation and nothing else (`"${x}"`), that value itself, as HCL's TemplateWrapExpr."""
    nodes = _compile(ev, rule, parts)
    if len(nodes) == 1 and isinstance(nodes[0], _Interp):
        return ev.expr(nodes[0].rule, scope)
    out = _Text()
    _run(ev, nodes, scope, out)
    return text(out.text())


def _run(ev: Evaluator, nodes: list, scope: Mapping[str, Any], out: _Text) -> None:
    for node in nodes:
        if isinstance(node, _Literal):
            out.add(node.text)
        elif isinstance(node, _Interp):
            value = ev.expr(node.rule, scope)
            try:
                out.add(to_string(value))
            except ValueError as exc:
                raise ev.error(f"interpolation: {exc}", node.rule) from None
        elif isinstance(node, _If):
            condition = ev.expr(node.start.condition, scope)
            try:
                chosen = node.then if to_bool(condition) else node.otherwise
            except ValueError as exc:
                raise ev.error(str(exc), node.start) from None
            _run(ev, chosen, scope, out)
        else:
            _for(ev, node, scope, out)


def _for(ev: Evaluator, node: _For, scope: Mapping[str, Any], out: _Text) -> None:
    start = node.start
    collection = ev.expr(start.collection, scope)
    try:
        items = iteration(collection)
    except ValueError:
        raise ev.error(f"%{{for}} cannot iterate over a {type_name(collection)}", start) from None
    # python-hcl2 calls the first of two names `iterator`; HCL makes that one the key.
    first = start.iterator.serialize()
    second = start.key_iterator.serialize() if start.key_iterator else None
    key_name, value_name = (first, second) if second else (None, first)
    for key, item in items:
        local = {**scope, value_name: item, **({key_name: key} if key_name else {})}
        _run(ev, node.body, local, out)


def heredoc(ev: Evaluator, rule: Any, scope: Mapping[str, Any]) -> str:
    """A heredoc, read as a template when the file was parsed (see `parse.heredoc_template`)."""
    template_rule = ev.bake.heredocs[id(rule)][1]
    if isinstance(template_rule, str):
        raise Unfollowed(template_rule)
    return ev.expr(template_rule, scope)
