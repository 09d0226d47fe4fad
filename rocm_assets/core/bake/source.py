"""The bake file as written, read with python-hcl2: its blocks, names and lines, never its values.

Bake evaluates the file. This says what `--print` cannot: the variables and top-level attributes
it declares (bake is asked for their values), the line of each block, attribute and object key
(for error messages and `check`), which target blocks are matrices, and `inherits` lists written
as literals (to follow an attribute's line to the block that sets it). The reading is cached on
disk by the file's bytes: python-hcl2 takes 0.12 s on the shipped file.
"""

import importlib.metadata
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import hcl2
import lark
from hcl2.rules import base as B, containers as C

from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.limits import MAX_FILE_BYTES, MAX_PARSE_DEPTH
from rocm_assets.core.common.cache import cache_dir, digest, read_json, write_json
from rocm_assets.core.common.names import label_problem
from rocm_assets.core.common.text import quote

KINDS = ("target", "group", "variable", "function")
_FORMAT = f"outline-2:{importlib.metadata.version('python-hcl2')}"
_TOKENS = {"RBRACE": "'}'", "LBRACE": "'{'", "RSQB": "']'", "LSQB": "'['", "RPAR": "')'",
           "LPAR": "'('", "EQ": "'='", "COMMA": "','", "DBLQUOTE": "'\"'", "NAME": "a name",
           "COLON": "':'", "QMARK": "'?'", "$END": "end of file"}  # fmt: skip


class UnreadableSyntax(BakeError):
    """A file python-hcl2 cannot parse; bake may still accept it (its grammar is wider)."""


@dataclass(frozen=True)
class TargetBlock:
    """One `target` block: its line, its attributes' and object keys' lines, as written."""

    line: int
    matrix: bool
    attrs: dict[str, int]
    keys: dict[str, dict[str, int]]
    # The `inherits` list when written as a list of plain strings; None otherwise.
    inherits: list[str] | None


@dataclass(frozen=True)
class Outline:
    """What the file declares, and where."""

    path: Path
    sha256: str
    variables: dict[str, int]
    attrs: dict[str, int]
    functions: dict[str, int]
    targets: dict[str, list[TargetBlock]]
    groups: dict[str, int]
    # Groups written `targets = []`: bake reads an empty group nested in another as a target.
    empty_groups: list[str]

    def line(self, name: str) -> int | None:
        """The line that declares a top-level name (attribute or variable)."""
        return self.attrs.get(name) or self.variables.get(name)

    @property
    def values(self) -> list[str]:
        """Every top-level name bake gives a value: variables, then attributes."""
        return [*self.variables, *(a for a in self.attrs if a not in self.variables)]

    def _chain(self, name: str, seen: tuple[str, ...] = ()) -> list[str]:
        """The target, then its parents, the one whose value wins first."""
        if name in seen or name not in self.targets:
            return []
        chain = [name]
        for block in reversed(self.targets[name]):
            if block.inherits is not None:
                for parent in reversed(block.inherits):
                    chain += self._chain(parent, (*seen, name))
                break
        return chain

    def attr_line(self, target: str, attr: str) -> int | None:
        """Where the file sets a target's attribute, through literal `inherits`."""
        for name in self._chain(target):
            for block in reversed(self.targets[name]):
                if attr in block.attrs:
                    return block.attrs[attr]
        return None

    def key_line(self, target: str, attr: str, key: str) -> int | None:
        """Where the file writes one key of a target's map attribute (args, contexts, ...)."""
        for name in self._chain(target):
            for block in reversed(self.targets[name]):
                if key in block.keys.get(attr, {}):
                    return block.keys[attr][key]
        return None


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


def _read(text: str, path: Path, sha256: str) -> Outline:
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


def _from_json(path: Path, data: dict) -> Outline:
    targets = {n: [TargetBlock(**b) for b in blocks] for n, blocks in data.pop("targets").items()}
    data.pop("path")
    return Outline(path, targets=targets, **data)


def read_outline(path: str | Path, env: Mapping[str, str] | None = None) -> Outline:
    """Read a bake file's outline; a missing, unreadable or unparsable file is one BakeError."""
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
        raise BakeError(f"cannot read bake file: not UTF-8 (byte {exc.start})", path=path) from None
    sha256 = digest(data)
    memo = (
        cache_dir(os.environ if env is None else env)
        / "outline"
        / f"{digest(_FORMAT, sha256)}.json"
    )
    cached = read_json(memo)
    if isinstance(cached, dict):
        try:
            return _from_json(path, cached)
        except (KeyError, TypeError):
            pass
    outline = _read(text, path, sha256)
    write_json(memo, {**asdict(outline), "path": str(path)})
    return outline
