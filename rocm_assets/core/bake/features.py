"""The oldest buildx a bake file needs, from the static reading: what each construct arrived with.

Every version below is the first release tag containing the commit that added the construct
(`git tag --contains <commit> | sort -V | head -1` in docker/buildx); the commit is named beside
it. Only constructs newer than buildx 0.13.1, the oldest release the farm supports, are listed.
An older bake rejects most of them (an unsupported argument or block, an unknown function); a
target attribute it does not know it ignores silently, so it resolves another target.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hcl2.rules import (
    directives as D,
    expressions as E,
    for_expressions as FE,
    functions as FN,
    literal_rules as L,
    strings as S,
)
from hcl2.rules.abstract import LarkRule

from rocm_assets.core.bake.parse import BakeFile, Block, line_of

Version = tuple[int, int, int]

# variable "x" { ... } attributes and blocks.
VARIABLE_ATTRIBUTES: dict[str, Version] = {
    "description": (0, 16, 0),  # 233b869c6 bake: add list-variables option
    "type": (0, 24, 0),  # 5b8a3b372 Allow variables to be explicitly typed (and enforced)
}
VARIABLE_BLOCKS: dict[str, Version] = {
    "validation": (0, 19, 0),  # e51cdcac5 bake: basic variable validation
}
TARGET_ATTRIBUTES: dict[str, Version] = {
    "description": (0, 16, 0),  # 8f4c8b094 bake: allow text descriptions for targets
    "call": (0, 16, 0),  # 8da28574b bake: add call methods support and printing
    "entitlements": (0, 17, 0),  # 203fd8aee bake: enable support for entitlements
    "network": (0, 17, 0),  # 83d5c0c61 bake: allow setting networkmode in HCL/JSON
    "extra-hosts": (0, 25, 0),  # b514ed45f bake: extra-hosts support
    "policy": (0, 31, 0),  # 9f1daffb3 policy: implement policy support for bake
    "resources": (0, 35, 0),  # 80b229388 build: Add per-step CPU and memory resource limits
}
# Target attributes that take objects as well as CSV strings in their lists.
OBJECT_ENTRIES: dict[str, Version] = {
    # 3ccbb88e6 bake: initial set of composable bake attributes
    "output": (0, 19, 0),
    "cache-from": (0, 19, 0),
    "cache-to": (0, 19, 0),
    "secret": (0, 19, 0),
    "ssh": (0, 19, 0),
}
FUNCTIONS: dict[str, Version] = {
    "indexof": (0, 14, 0),  # 5777d980b bake: add indexof hcl func
    "basename": (0, 17, 0),  # a4adae3d6 bake: add basename, dirname and sanitize functions
    "dirname": (0, 17, 0),  # a4adae3d6
    "sanitize": (0, 17, 0),  # a4adae3d6
    "homedir": (0, 27, 0),  # e4b49a8cd bake: add homedir func
    "semvercmp": (0, 31, 0),  # 3836aeb94 bake: add semvercmp func to stdlib
    "formattimestamp": (0, 33, 0),  # 2798e134e bake: add formattimestamp and tighten ...
    "unixtimestampparse": (0, 33, 0),  # 11395747a bake: add unixtimestampparse function
}


@dataclass(frozen=True, order=True)
class Requirement:
    """A construct of the file and the first buildx release that reads it."""

    version: Version
    construct: str
    line: int | None = None

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"{self.construct}{where} needs buildx >= {self.version_text}"


def _rules(root: Any) -> Iterator[Any]:
    """Every rule under `root`, iteratively (a file may nest deeply)."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in getattr(node, "children", None) or () if isinstance(c, LarkRule))


def names_used(root: Any, heredocs: dict[int, Any] | None = None) -> tuple[list[str], list[str]]:
    """The variables (root names) and functions an expression refers to, in order of use.

    Names a `for` binds anywhere in it are left out (a variable of that name is then missed).
    """
    variables: dict[str, None] = {}
    functions: dict[str, None] = {}
    bound: set[str] = set()
    stack: list[tuple[Any, Any]] = [(root, None)]
    while stack:
        node, parent = stack.pop()
        if isinstance(node, L.IdentifierRule):
            if isinstance(parent, E.ExprTermRule):
                variables[node.serialize()] = None
            elif isinstance(parent, FE.ForIntroRule | D.TemplateForStartRule):
                bound.add(node.serialize())
        elif isinstance(node, FN.FunctionCallRule):
            functions[".".join(i.serialize() for i in node.identifiers)] = None
        elif heredocs and isinstance(node, S.HeredocTemplateRule) and id(node) in heredocs:
            if not isinstance(heredocs[id(node)][1], str):
                stack.append((heredocs[id(node)][1], node))
        children = getattr(node, "children", None) or ()
        stack.extend((c, node) for c in reversed(children) if isinstance(c, LarkRule))
    return [v for v in variables if v not in bound], list(functions)


def _attribute_requirements(
    blocks: list[Block], kind: str, table: dict[str, Version]
) -> Iterator[Requirement]:
    for block in blocks:
        for attr, rule in block.attrs.items():
            if attr in table:
                yield Requirement(table[attr], f"{kind} {block.name!r}: {attr}", line_of(rule))


def _object_entries(block: Block) -> Iterator[Requirement]:
    for attr, since in OBJECT_ENTRIES.items():
        rule = block.attrs.get(attr)
        if rule is None:
            continue
        # A literal list holding an object literal: the object form of an entry.
        for node in _rules(rule.expression):
            if type(node).__name__ == "ObjectRule":
                yield Requirement(
                    since, f"target {block.name!r}: {attr} entry as an object", line_of(node)
                )
                break


def requirements(bake: BakeFile) -> list[Requirement]:
    """Each construct of the file that a buildx newer than 0.13.1 introduced, in line order."""
    found: list[Requirement] = []
    for block in bake.variables.values():
        found += _attribute_requirements([block], "variable", VARIABLE_ATTRIBUTES)
        for rule in block.blocks:
            name = rule.labels[0].serialize()
            if name in VARIABLE_BLOCKS:
                found.append(
                    Requirement(
                        VARIABLE_BLOCKS[name], f"variable {block.name!r}: {name}", line_of(rule)
                    )
                )
    for blocks in bake.targets.values():
        found += _attribute_requirements(blocks, "target", TARGET_ATTRIBUTES)
        for block in blocks:
            found += _object_entries(block)
    roots = [bake.tree, *(t for _, t in bake.heredocs.values() if not isinstance(t, str))]
    for root in roots:
        for node in _rules(root):
            if isinstance(node, FN.FunctionCallRule):
                name = ".".join(i.serialize() for i in node.identifiers)
                if name in FUNCTIONS and name not in bake.functions:
                    found.append(Requirement(FUNCTIONS[name], f"function {name}()", line_of(node)))
    return sorted(set(found), key=lambda r: (r.line or 0, r.construct))


def minimum(bake: BakeFile) -> Requirement | None:
    """The requirement with the highest version (the first in the file among equals), if any."""
    found = requirements(bake)
    return max(found, key=lambda r: r.version, default=None)
