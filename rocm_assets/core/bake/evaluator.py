"""What the evaluator's parts (blocks, calls, fields, operators, templates, variables) may ask of
the evaluation they serve: a protocol, so each part depends on this and `evaluate` depends on
the parts, and no module imports the one that imports it."""

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.limits import Budget
from rocm_assets.core.bake.parse import BakeFile, Block
from rocm_assets.core.bake.values import Value


@dataclass(frozen=True)
class TargetPart:
    """One block's share of a target, with its matrix combination in scope."""

    block: Block
    scope: dict[str, Value]


@dataclass(frozen=True)
class Expansion:
    """Every target name with its parts, and the groups matrix labels became."""

    targets: dict[str, list[TargetPart]]
    groups: dict[str, tuple[list[str], int]]


class Evaluator(Protocol):
    """One bake file's values under one environment (`evaluate.Evaluation`)."""

    bake: BakeFile
    env: Mapping[str, str]
    budget: Budget
    calls: list[str]
    templates: dict[int, tuple[Any, list]]
    owned: dict[str, dict[str, Value]]

    @property
    def builtins(self) -> dict[str, str]: ...

    @property
    def expansion(self) -> Expansion: ...

    def error(self, message: str, rule: Any = None, line: int | None = None) -> BakeError: ...

    def nested(self, rule: Any = None, line: int | None = None) -> AbstractContextManager[None]: ...

    def limits(self, rule: Any = None, line: int | None = None) -> AbstractContextManager[None]: ...

    def built(self, value: Value, rule: Any) -> Value: ...

    def value(self, name: str, rule: Any = None) -> Value: ...

    def truth(self, value: Value, rule: Any) -> bool: ...

    def expr(self, rule: Any, scope: Mapping[str, Value]) -> Value: ...
