"""Parse a bake file with python-hcl2 into its blocks and attributes, unevaluated.

python-hcl2's dict output loses line numbers and blurs bare identifiers with strings, so the
evaluator (`rocm_assets.core.bake.evaluate`) walks the typed tree this keeps.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2
import lark
from hcl2.rules import base as B

from rocm_assets.core.bake.errors import BakeError

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


def parse(text: str, path: Path) -> B.StartRule:
    """Parse HCL text, turning lark's multi-line errors into one line with file:line."""
    try:
        return hcl2.parses(text)
    except lark.exceptions.UnexpectedInput as exc:
        expected = sorted(getattr(exc, "expected", None) or getattr(exc, "allowed", None) or ())
        names = [_TOKEN_NAMES.get(t, t.lower()) for t in expected if t != "NL_OR_COMMENT"][:6]
        token = getattr(exc, "token", None)
        got = (
            "end of file"
            if token is not None and token.type == "$END"
            else repr(str(token or "")[:20])
        )
        hint = f"; expected {', '.join(names)}" if names else ""
        raise BakeError(
            f"syntax error at column {exc.column}: unexpected {got}{hint}", path=path, line=exc.line
        ) from None
    except lark.exceptions.LarkError as exc:
        raise BakeError(f"syntax error: {str(exc).splitlines()[0]}", path=path) from None


def label_of(rule: Any) -> str:
    text = rule.serialize()
    return text[1:-1] if isinstance(text, str) and text.startswith('"') else str(text)


class BakeFile:
    """A parsed bake file. `evaluate(env)` gives every value, target and group for that env."""

    def __init__(self, path: Path, text: str):
        self.path = path
        self.tree = parse(text, path)
        self.attrs: dict[str, B.AttributeRule] = {}
        self.variables: dict[str, Block] = {}
        self.functions: dict[str, Block] = {}
        self.targets: dict[str, list[Block]] = {}
        self.groups: dict[str, list[Block]] = {}
        for child in self.tree.body.children:
            if isinstance(child, B.AttributeRule):
                self.attrs[child.identifier.serialize()] = child
            elif isinstance(child, B.BlockRule):
                self._add_block(child)

    def _add_block(self, rule: B.BlockRule) -> None:
        labels = [label_of(label) for label in rule.labels]
        kind, line = labels[0], line_of(rule)
        if kind not in ("target", "group", "variable", "function"):
            # Bake ignores unknown blocks silently (there is no `locals`); an error says why.
            raise BakeError(
                f"unknown block type {kind!r}: bake has target, group, variable and function "
                "(use top-level attributes instead of locals)",
                path=self.path,
                line=line,
            )
        if len(labels) != 2:
            raise BakeError(f"a {kind} block needs exactly one label", path=self.path, line=line)
        block = Block(kind, labels[1], line)
        for child in rule.body.children:
            if isinstance(child, B.AttributeRule):
                block.attrs[child.identifier.serialize()] = child
            elif isinstance(child, B.BlockRule):
                block.blocks.append(child)
        if kind == "target":
            self.targets.setdefault(block.name, []).append(block)
        elif kind == "group":
            self.groups.setdefault(block.name, []).append(block)
        elif kind == "variable":
            self.variables[block.name] = block
        else:
            self.functions[block.name] = block


def load_bake(path: str | Path) -> BakeFile:
    """Read and parse a bake file; a missing or unreadable file is a one-line BakeError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BakeError("bake file not found", path=path) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise BakeError(f"cannot read bake file: {reason}", path=path) from None
    return BakeFile(path, text)
