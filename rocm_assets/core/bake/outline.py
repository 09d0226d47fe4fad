"""What python-hcl2 reads of the bake file (`hcl_tree`), cached by `source`: names and lines."""

from dataclasses import dataclass
from pathlib import Path

from rocm_assets.core.bake.errors import BakeError


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
    def top_level_names(self) -> list[str]:
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
