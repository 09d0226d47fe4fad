"""Parse a bake file with python-hcl2 into its blocks and attributes, unevaluated.

python-hcl2's dict output loses line numbers and blurs bare identifiers with strings, so the
evaluator (`rocm_assets.core.bake.evaluate`) walks the typed tree this keeps.
"""

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2
import hcl2.parser
import lark
from hcl2.postlexer import PostLexer
from hcl2.rules import base as B, containers as C, expressions as E, functions as FN, strings as S
from hcl2.rules.abstract import LarkRule

from rocm_assets.core.bake.errors import BakeError, NeedsBuildx, UnreadableSyntax
from rocm_assets.core.bake.limits import MAX_FILE_BYTES, MAX_PARSE_DEPTH, quote
from rocm_assets.core.bake.names import label_problem

# The rule python-hcl2 writes for a unary operator: one operand term, never another operator.
_UNARY = "!unary_op : (MINUS | NOT) expr_term"
_TOKEN_NAMES = {
    "RBRACE": "'}'",
    "LBRACE": "'{'",
    "RSQB": "']'",
    "LSQB": "'['",
    "RPAR": "')'",
    "LPAR": "'('",
    "EQ": "'='",
    "COMMA": "','",
    "DBLQUOTE": "'\"'",
    "NAME": "a name",
    "NL_OR_COMMENT": "a newline",
    "COLON": "':'",
    "QMARK": "'?'",
    "INT_LITERAL": "a number",
    "$END": "end of file",
}


def line_of(rule: Any) -> int:
    meta = getattr(rule, "_meta", None)
    return getattr(meta, "line", 0) or 0


@dataclass
class Block:
    """One `target`, `group`, `variable` or `function` block, with its attributes unevaluated."""

    kind: str
    name: str
    line: int
    attrs: dict[str, B.AttributeRule] = field(default_factory=dict)
    blocks: list[B.BlockRule] = field(default_factory=list)


def _deepest(tree: lark.Tree) -> tuple[int, int]:
    """(depth, line) of the deepest node of a lark tree, walked without recursion."""
    best, line = 0, 0
    stack: list[tuple[Any, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > best:
            best, line = depth, getattr(node, "line", None) or line
        if isinstance(node, lark.Tree):
            stack.extend((child, depth + 1) for child in node.children)
        if best > MAX_PARSE_DEPTH:
            break
    return best, line


@functools.cache
def _unary_parser() -> lark.Lark:
    """python-hcl2's grammar with one fix: a unary operator may apply to another (`!!x`,
    `- -1`), as in HCL. Built (and cached by lark) only for a file that needs it."""
    grammar = (Path(hcl2.parser.__file__).parent / "hcl2.lark").read_text()
    if _UNARY not in grammar:
        raise RuntimeError("python-hcl2's grammar changed: update parse._UNARY")
    return lark.Lark(
        grammar.replace(_UNARY, "!unary_op : (MINUS | NOT) (expr_term | unary_op)"),
        parser="lalr",
        propagate_positions=True,
        postlex=PostLexer(),
        cache=True,
    )


def _parse_tree(text: str) -> lark.Tree:
    try:
        return hcl2.parses_to_tree(text)
    except lark.exceptions.UnexpectedInput:
        if not re.search(r"[!-]\s*[!-]", text):
            raise
        try:
            return _unary_parser().parse(text + "\n")
        except lark.exceptions.UnexpectedInput:
            pass
        raise


def parse(text: str, path: Path, first_line: int = 1) -> B.StartRule:
    """Parse HCL text, turning lark's multi-line errors into one line with file:line.

    `first_line` places text cut from a larger file (a heredoc body) at its line there.
    """
    try:
        tree = _parse_tree(text)
    except lark.exceptions.UnexpectedInput as exc:
        expected = sorted(getattr(exc, "expected", None) or getattr(exc, "allowed", None) or ())
        names = [_TOKEN_NAMES.get(t, t.lower()) for t in expected if t != "NL_OR_COMMENT"][:6]
        token = getattr(exc, "token", None)
        got = (
            "end of file"
            if token is not None and token.type == "$END"
            else quote(str(token or ""), 20)
        )
        hint = f"; expected {', '.join(names)}" if names else ""
        raise UnreadableSyntax(
            f"syntax error at column {exc.column}: unexpected {got}{hint}",
            path=path,
            line=exc.line + first_line - 1,
        ) from None
    except Exception as exc:  # lark's other errors, and anything python-hcl2 raises
        raise UnreadableSyntax(f"syntax error: {_cause(exc)}", path=path) from None
    depth, line = _deepest(tree)
    if depth > MAX_PARSE_DEPTH:
        raise BakeError(
            f"expressions nest deeper than the limit of {MAX_PARSE_DEPTH} parse levels",
            path=path,
            line=line + first_line - 1,
        )
    try:
        return hcl2.transform(tree)
    except Exception as exc:  # e.g. a number literal Python cannot read
        raise UnreadableSyntax(f"cannot read the file: {_cause(exc)}", path=path) from None


def _cause(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {quote(text, 120)[1:-1]}" if text else type(exc).__name__


def _skip_string(text: str, i: int) -> int:
    """The index after the quoted string starting at text[i] (nested templates included)."""
    i += 1
    while i < len(text) and text[i] != '"':
        if text[i] == "\\":
            i += 2
        elif text.startswith(("${", "%{"), i):
            i = _skip_template(text, i + 2)
        else:
            i += 1
    return i + 1


def _skip_template(text: str, i: int) -> int:
    """The index after the `}` closing the template sequence whose body starts at text[i]."""
    depth = 1
    while i < len(text):
        ch = text[i]
        if ch == '"':
            i = _skip_string(text, i)
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def _escape_heredoc(body: str) -> str:
    """A heredoc body as the inside of a quoted string: its literal text escaped (heredocs take
    no backslash escapes), its `${...}` and `%{...}` sequences kept as they are."""
    out: list[str] = []
    i = 0
    while i < len(body):
        if body.startswith(("$${", "%%{"), i):
            out.append(body[i : i + 3])
            i += 3
        elif body.startswith(("${", "%{"), i):
            end = _skip_template(body, i + 2)
            out.append(body[i:end].replace("\n", " "))
            i = end
        else:
            out.append({"\\": "\\\\", '"': '\\"', "\n": "\\n"}.get(body[i], body[i]))
            i += 1
    return "".join(out)


def heredoc_template(rule: Any, path: Path) -> Any:
    """A heredoc's body, trimmed for `<<-`, as the expression of a quoted template.

    Re-read as a quoted string with its backslashes and quotes escaped, interpolation works as
    in strings while the text stays literal (heredocs take no backslash escapes). Done once, when
    the file is parsed, so no parse runs deep inside an evaluation.
    """
    raw = str(rule.heredoc if hasattr(rule, "heredoc") else rule.serialize())
    header, _, rest = raw.partition("\n")
    marker = header.lstrip("<-").strip()
    body = rest.rstrip("\n")
    body = body[: body.rfind("\n") + 1] if body.endswith(marker) else body
    lines = body.split("\n")
    if header.startswith("<<-"):
        indents = [len(x) - len(x.lstrip()) for x in lines if x.strip()]
        cut = min(indents, default=0)
        lines = [x[cut:] for x in lines]
    if re.search(r"%\{~|~\}", "\n".join(lines)):
        # HCL trims per line token here, this reader joins the lines: refused when evaluated.
        return "a strip marker (~) in a heredoc"
    escaped = _escape_heredoc("\n".join(lines))
    sub = parse(f'x = "{escaped}"\n', path, first_line=line_of(rule))
    return next(c for c in sub.body.children if isinstance(c, B.AttributeRule)).expression


# Where HCL lets a heredoc end: its closing line's newline ends the expression unless brackets
# enclose it (python-hcl2 reads on, so `x ? <<EOT ... EOT` then `: y` parses here, not in bake).
_HEREDOC_PARENTS = (B.AttributeRule, C.TupleRule, C.ObjectElemRule, FN.ArgumentsRule)


def _heredocs(tree: Any, path: Path, text: str) -> dict[int, tuple[Any, Any]]:
    """id(heredoc rule) -> (rule, its template), for every heredoc in the tree, found iteratively.

    The template is instead the reason it is refused where this reader cannot follow bake.
    """
    found: dict[int, tuple[Any, Any]] = {}
    # (node, its parent past ExprTermRule wrappers, whether it is in the file's own tree)
    stack: list[tuple[Any, Any, bool]] = [(tree, None, True)]
    while stack:
        node, parent, own = stack.pop()
        if isinstance(node, S.HeredocTemplateRule):
            template = heredoc_template(node, path)
            if not isinstance(parent, _HEREDOC_PARENTS):
                template = "a heredoc inside an operator or conditional"
            elif own and isinstance(parent, C.ObjectElemRule):
                end = getattr(getattr(node, "_meta", None), "end_pos", None)
                if end is not None and text[end:].lstrip().startswith(","):
                    # A newline ends an object element: bake refuses the comma after it.
                    template = "a comma after a heredoc in an object"
            found[id(node)] = (node, template)
            if not isinstance(template, str):
                stack.append((template, node, False))
        node_parent = parent if isinstance(node, E.ExprTermRule) and parent is not None else node
        children = getattr(node, "children", None) or ()
        stack.extend((c, node_parent, own) for c in children if isinstance(c, LarkRule))
    return found


def label_of(rule: Any) -> str:
    text = rule.serialize()
    return text[1:-1] if isinstance(text, str) and text.startswith('"') else str(text)


def _attributes(rule: Any, where: str, path: Path) -> dict[str, B.AttributeRule]:
    """The attributes of a body; one set twice is an error, as it is in HCL."""
    attrs: dict[str, B.AttributeRule] = {}
    for child in rule.children:
        if isinstance(child, B.AttributeRule):
            name = child.identifier.serialize()
            if name in attrs:
                raise BakeError(
                    f"{quote(name)} is set twice{where} (first at line {line_of(attrs[name])})",
                    path=path,
                    line=line_of(child),
                )
            attrs[name] = child
    return attrs


class BakeFile:
    """A parsed bake file. `evaluate(env)` gives every value, target and group for that env."""

    def __init__(self, path: Path, text: str):
        self.path = path
        self.text = text
        self.tree = parse(text, path)
        self.heredocs = _heredocs(self.tree, path, text)
        self.attrs = _attributes(self.tree.body, "", path)
        self.variables: dict[str, Block] = {}
        self.functions: dict[str, Block] = {}
        self.targets: dict[str, list[Block]] = {}
        self.groups: dict[str, list[Block]] = {}
        for child in self.tree.body.children:
            if isinstance(child, B.BlockRule):
                self._add_block(child)

    def _add_block(self, rule: B.BlockRule) -> None:
        labels = [label_of(label) for label in rule.labels]
        kind, line = labels[0], line_of(rule)
        if kind not in ("target", "group", "variable", "function"):
            # Bake ignores unknown blocks silently (there is no `locals`): refused, with why.
            raise NeedsBuildx(
                f"unknown block type {quote(kind)}, which bake ignores: bake has target, group, "
                "variable and function (use top-level attributes instead of locals)",
                path=self.path,
                line=line,
            )
        if len(labels) != 2:
            raise BakeError(f"a {kind} block needs exactly one label", path=self.path, line=line)
        problem = label_problem(kind, labels[1])
        if problem:
            raise BakeError(problem, path=self.path, line=line)
        block = Block(
            kind,
            labels[1],
            line,
            _attributes(rule.body, f" in {kind} {quote(labels[1])}", self.path),
        )
        for child in rule.body.children:
            if isinstance(child, B.BlockRule):
                if kind != "variable" or label_of(child.labels[0]) != "validation":
                    raise BakeError(
                        f"{kind} {quote(block.name)} has a nested block bake does not allow "
                        "(only variables have `validation` blocks)",
                        path=self.path,
                        line=line_of(child),
                    )
                block.blocks.append(child)
        if kind == "target":
            self.targets.setdefault(block.name, []).append(block)
        elif kind == "group":
            self.groups.setdefault(block.name, []).append(block)
        else:
            # Bake keeps only the last block of a name, dropping the first one's default and
            # validation whole; in one file that is a mistake, so it is refused.
            known = self.variables if kind == "variable" else self.functions
            if block.name in known:
                raise NeedsBuildx(
                    f"{kind} {quote(block.name)} is declared again (first at line "
                    f"{known[block.name].line}): bake would use only this block and drop the "
                    "other's default and validation; keep one",
                    path=self.path,
                    line=line,
                )
            known[block.name] = block


def load_bake(path: str | Path) -> BakeFile:
    """Read and parse a bake file; a missing or unreadable file is a one-line BakeError."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise BakeError("bake file not found", path=path) from None
    except OSError as exc:
        raise BakeError(f"cannot read bake file: {exc.strerror or exc}", path=path) from None
    if len(data) > MAX_FILE_BYTES:
        raise BakeError(f"bake file is over the limit of {MAX_FILE_BYTES} bytes", path=path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BakeError(f"cannot read bake file: {_cause(exc)}", path=path) from None
    return BakeFile(path, text)
