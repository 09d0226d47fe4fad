"""The build fleet: fleet.yaml validated into frozen models.

Both the code location and the run coordinator load the manifest through `load_fleet`, so the two
processes cannot disagree about the nodes. What a node says about itself over SSH is
`rocm_assets.core.probes`.
"""

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from rocm_assets.core.constants import DEFAULT_FLEET_FILE, FLEET_FILE_ENV

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

_GIB_PER_KIB = 1024**2
_SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
_USER_KNOWN_HOSTS = "~/.ssh/known_hosts"


class FleetError(ValueError):
    """A fleet manifest that cannot be used; the message is one line naming the file and field."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Node(_Frozen):
    """One BuildKit node: the buildx builder that reaches it and its nominal capacity."""

    name: str = Field(min_length=1)
    builder: str = Field(min_length=1)
    # user@host[:port]; nodes without it are not probed and the figures below stand in.
    ssh: str | None = Field(default=None, min_length=1)
    cores: int = Field(gt=0, strict=True)
    mem_gb: float = Field(gt=0, strict=True)
    # Upload speed to the registry: pushes dominate on slow links (scheduling-facts §3.2).
    link_mbps: float = Field(gt=0, strict=True)
    gpus: tuple[str, ...] = ()


class TargetCost(_Frozen):
    """A target's build time and pushed size, measured on the reference node."""

    seconds: float = Field(gt=0, strict=True)
    size_gb: float = Field(ge=0, strict=True)


class Reference(_Frozen):
    """The node the `target_costs` figures were measured on."""

    cores: int = Field(gt=0, strict=True)
    mem_gb: float = Field(gt=0, strict=True)


# A target with no measured entry: ten minutes and 1 GB, a middling wheel-sized build in
# scheduling-facts §3.2, so an unlisted target is neither free nor dominant in a plan.
DEFAULT_TARGET_COST = TargetCost(seconds=600.0, size_gb=1.0)


class Fleet(_Frozen):
    """The validated manifest. `costs` is keyed by bake target name."""

    nodes: tuple[Node, ...]
    reference: Reference
    costs: Mapping[str, TargetCost]

    # Emptiness is checked here rather than with min_length: pydantic would also report a list
    # whose only entries are invalid as empty, a second error for the same mistake.
    @field_validator("nodes")
    @classmethod
    def _nodes_listed_once(cls, nodes: tuple[Node, ...]) -> tuple[Node, ...]:
        if not nodes:
            raise PydanticCustomError("no_nodes", "must list at least one node")
        seen: set[str] = set()
        for index, node in enumerate(nodes):
            if node.name in seen:
                raise PydanticCustomError(
                    "duplicate_node",
                    "duplicate node name '{name}'",
                    {"name": node.name, "index": index},
                )
            seen.add(node.name)
        return nodes

    def cost(self, target: str) -> TargetCost:
        """The reference-node cost of `target`, or `DEFAULT_TARGET_COST` when it has no entry."""
        return self.costs.get(target, DEFAULT_TARGET_COST)

    def node(self, name: str) -> Node:
        """The node called `name`; FleetError naming the known nodes if there is none."""
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes)
        raise FleetError(f"no node {name!r} in the fleet (nodes: {known})")


def fleet_path(explicit: str | Path | None = None) -> Path:
    """The manifest to read: `explicit`, else $ROCM_FLEET_FILE, else ./fleet.yaml."""
    if explicit is not None and str(explicit):
        return Path(explicit)
    from_env = os.environ.get(FLEET_FILE_ENV)
    if from_env:
        return Path(from_env)
    return Path(DEFAULT_FLEET_FILE)


def load_fleet(path: str | Path | None = None) -> Fleet:
    """Read and validate the manifest chosen by `fleet_path(path)`.

    Raises:
        FleetError: one line naming the file and the field, line or OS error to fix.
    """
    resolved = fleet_path(path)
    try:
        text = resolved.read_text(encoding="utf-8")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise FleetError(
            f"{resolved}: cannot read fleet file: {reason} (set {FLEET_FILE_ENV} or pass a path)"
        ) from None
    except UnicodeDecodeError as exc:
        raise FleetError(f"{resolved}: not UTF-8 text at byte {exc.start}") from None
    return parse_fleet(text, str(resolved))


def parse_fleet(text: str, source: str) -> Fleet:
    """Validate manifest text; `source` names it in errors.

    The file keeps the reference node inside `target_costs:` (as the issue's schema has it); the
    model holds it apart so a target can never be called "reference".

    Raises:
        FleetError: one line, `<source>: <field path>: <problem>` or `<source>:<line>:<col>: ...`.
    """
    try:
        # A SafeLoader subclass: no arbitrary objects, and repeated keys are errors.
        doc = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as exc:
        raise FleetError(_yaml_error(source, exc)) from None
    except yaml.YAMLError as exc:
        raise FleetError(f"{source}: YAML error: {one_line(str(exc))}") from None
    if doc is None:
        raise FleetError(f"{source}: empty file; expected nodes: and target_costs:")
    if not isinstance(doc, dict):
        raise FleetError(f"{source}: expected a mapping with nodes: and target_costs:")
    for key in doc:
        if key not in ("nodes", "target_costs"):
            raise FleetError(f"{source}: {key}: unknown key")
    if "target_costs" not in doc:
        raise FleetError(f"{source}: target_costs: missing")
    costs = doc["target_costs"]
    if not isinstance(costs, dict):
        raise FleetError(f"{source}: target_costs: expected a mapping of target name to cost")
    # Absent keys stay absent so pydantic reports them as missing, with the rest of the errors.
    data: dict[str, Any] = {"costs": {k: v for k, v in costs.items() if k != "reference"}}
    if "reference" in costs:
        data["reference"] = costs["reference"]
    if "nodes" in doc:
        data["nodes"] = doc["nodes"]
    try:
        return Fleet.model_validate(data)
    except ValidationError as exc:
        raise FleetError(_validation_error(source, exc)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a repeated key instead of silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_error(source: str, exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or exc.context or "unparseable"
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    return f"{where}: invalid YAML: {one_line(problem)}"


def _validation_error(source: str, exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    first = errors[0]
    path, problem = _describe(first)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {path}: {problem}{more}"


def _describe(error: Mapping[str, Any]) -> tuple[str, str]:
    loc = tuple(error["loc"])
    kind = error["type"]
    ctx = error.get("ctx") or {}
    got = shown(error.get("input"))
    if kind == "duplicate_node":
        return f"nodes[{ctx['index']}].name", f"duplicate node name {ctx['name']!r}"
    problems = {
        "missing": "missing",
        "extra_forbidden": "unknown key",
        "greater_than": f"must be > {ctx.get('gt', 0):g} (got {got})",
        "greater_than_equal": f"must be >= {ctx.get('ge', 0):g} (got {got})",
        "no_nodes": "must list at least one node",
        "string_too_short": "must not be empty",
    }
    problem = problems.get(kind, f"{error['msg'].lower()} (got {got})")
    return _field_path(loc), problem


def _field_path(loc: tuple[Any, ...]) -> str:
    # The model's reference/costs live under target_costs: in the file; report file paths.
    if loc and loc[0] == "reference":
        loc = ("target_costs", *loc)
    elif loc and loc[0] == "costs":
        loc = ("target_costs", *loc[1:])
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def shown(value: object) -> str:
    text = repr(value) if isinstance(value, str) else one_line(str(value))
    return text if len(text) <= 60 else text[:57] + "..."


def one_line(text: str) -> str:
    return " ".join(text.split())
