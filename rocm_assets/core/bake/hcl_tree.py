"""The bake file's python-hcl2 tree walked into an `Outline` (source.py): names and lines only."""

from pathlib import Path
from typing import Any

import hcl2
import lark
from hcl2.rules import base as B, containers as C

from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.limits import MAX_PARSE_DEPTH
from rocm_assets.core.bake.outline import Outline, TargetBlock, UnreadableSyntax
from rocm_assets.core.common.names import label_problem
from rocm_assets.core.common.text import quote

KINDS = ("target", "group", "variable", "function")
_TOKENS = {"RBRACE": "'}'", "LBRACE": "'{'", "RSQB": "']'", "LSQB": "'['", "RPAR": "')'",
           "LPAR": "'('", "EQ": "'='", "COMMA": "','", "DBLQUOTE": "'\"'", "NAME": "a name",
           "COLON": "':'", "QMARK": "'?'", "$END": "end of file"}  # fmt: skip


def line_of(rule: Any) -> int:
    return getattr(getattr(rule, "_meta", None), "line", 0) or 0


def label_of(rule: Any) -> str:
    text = rule.serialize()
    return text[1:-1] if isinstance(text, str) and text.startswith('"') else str(text)


def _strings(rule: B.AttributeRule) -> list[str] | None:
    """A list of plain string literals, as written; None for anything else."""
    value = rule.expression.serialize()
    if not isinstance(value, list):
        return None
    out = []
    for item in value:
        if not (isinstance(item, str) and len(item) > 1 and item[0] == item[-1] == '"'):
            return None
        if any(s in item for s in ("${", "%{", "\\")):
            return None
        out.append(item[1:-1])
    return out


def _keys(rule: Any) -> dict[str, int]:
    """Every object key written inside `rule`, first written wins: both branches of a conditional
    and each argument of merge() are walked, so a key is found wherever the file writes it."""
    found: dict[str, int] = {}
    stack = [rule]
    while stack:
        node = stack.pop()
        if isinstance(node, C.ObjectElemRule) and isinstance(node.key, C.ObjectElemKeyRule):
            found.setdefault(label_of(node.key), line_of(node))
        stack.extend(reversed([c for c in getattr(node, "children", None) or () if c is not None]))
    return found


def _depth(tree: lark.Tree) -> tuple[int, int]:
    """(depth, line) of the deepest node of a lark tree, walked without recursion."""
    best, line = 0, 0
    stack: list[tuple[Any, int]] = [(tree, 1)]
    while stack and best <= MAX_PARSE_DEPTH:
        node, depth = stack.pop()
        if depth > best:
            best, line = depth, getattr(node, "line", None) or line
        if isinstance(node, lark.Tree):
            stack.extend((child, depth + 1) for child in node.children)
    return best, line


def _parse(text: str, path: Path) -> B.StartRule:
    try:
        tree = hcl2.parses_to_tree(text)
    except lark.exceptions.UnexpectedInput as exc:
        expected = sorted(getattr(exc, "expected", None) or getattr(exc, "allowed", None) or ())
        names = [_TOKENS.get(t, t.lower()) for t in expected if t != "NL_OR_COMMENT"][:6]
        token = getattr(exc, "token", None)
        got = (
            "end of file"
            if token is not None and token.type == "$END"
            else quote(str(token or ""), 20)
        )
        hint = f"; expected {', '.join(names)}" if names else ""
        raise UnreadableSyntax(
            f"syntax error at column {exc.column}: unexpected {got}{hint}", path=path, line=exc.line
        ) from None
    except Exception as exc:  # lark's other errors, and anything python-hcl2 raises
        raise UnreadableSyntax(f"syntax error: {type(exc).__name__}", path=path) from None
    depth, line = _depth(tree)
    if depth > MAX_PARSE_DEPTH:
        raise BakeError(
            f"expressions nest deeper than the limit of {MAX_PARSE_DEPTH} parse levels",
            path=path,
            line=line,
        )
    try:
        return hcl2.transform(tree)
    except Exception as exc:  # e.g. a number literal Python cannot read
        raise UnreadableSyntax(f"cannot read the file: {type(exc).__name__}", path=path) from None


def read_tree(text: str, path: Path, sha256: str) -> Outline:
    outline = Outline(path, sha256, {}, {}, {}, {}, {}, [])
    for child in _parse(text, path).body.children:
        if isinstance(child, B.AttributeRule):
            outline.attrs.setdefault(child.identifier.serialize(), line_of(child))
        if not isinstance(child, B.BlockRule):
            continue
        labels = [label_of(label) for label in child.labels]
        kind, line = labels[0], line_of(child)
        if kind not in KINDS:
            # Bake ignores unknown blocks silently (there is no `locals`): refused, with why.
            raise BakeError(
                f"unknown block type {quote(kind)}, which bake ignores: bake has target, group, "
                "variable and function (use top-level attributes instead of locals)",
                path=path,
                line=line,
            )
        if len(labels) != 2:
            raise BakeError(f"a {kind} block needs exactly one label", path=path, line=line)
        name = labels[1]
        problem = label_problem(kind, name)
        if problem:
            raise BakeError(problem, path=path, line=line)
        attrs = {
            a.identifier.serialize(): a
            for a in child.body.children
            if isinstance(a, B.AttributeRule)
        }
        if kind == "target":
            block = TargetBlock(
                line,
                "matrix" in attrs,
                {k: line_of(a) for k, a in attrs.items()},
                {k: _keys(a.expression) for k, a in attrs.items()},
                _strings(attrs["inherits"]) if "inherits" in attrs else None,
            )
            outline.targets.setdefault(name, []).append(block)
        elif kind == "group":
            outline.groups.setdefault(name, line)
            if "targets" in attrs and _strings(attrs["targets"]) == []:
                outline.empty_groups.append(name)
        else:
            known = outline.variables if kind == "variable" else outline.functions
            if name in known:
                # Bake keeps only the last block of a name, dropping the first one's default and
                # validation whole; in one file that is a mistake.
                raise BakeError(
                    f"{kind} {quote(name)} is declared again (first at line {known[name]}): bake "
                    "would use only this block and drop the other's default and validation; keep one",
                    path=path,
                    line=line,
                )
            known[name] = line
    return outline
