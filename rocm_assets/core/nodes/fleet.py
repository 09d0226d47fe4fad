"""The build fleet: fleet.yaml validated into frozen models.

Both the code location and the run coordinator load the manifest through `load_fleet`, so the two
processes cannot disagree about the nodes. What a node says about itself over SSH is
`rocm_assets.core.nodes.probes`.

The loader does bounded work on any input: the file is capped in size, YAML anchors and aliases
are refused before anything is built from them (an alias bomb is a few hundred bytes), nesting is
capped, every key must be a string, and no error message renders more than a short excerpt of
a value. Whatever goes wrong ends as one `FleetError` line naming the file and the line or field.
"""

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from rocm_assets.core.common.constants import DEFAULT_FLEET_FILE, FLEET_FILE_ENV
from rocm_assets.core.common.text import bounded, shown

# The shipped manifest is ~4 KB and a farm of a hundred nodes ~20 KB; 256 KiB parses in about a
# second, and a daemon re-reads a file that failed on every tick.
MAX_FLEET_BYTES = 256 << 10
# The schema nests four levels (nodes, a node, gpus); the rest is headroom for flow style.
MAX_FLEET_DEPTH = 16
_MERGE_TAG = "tag:yaml.org,2002:merge"


class FleetError(ValueError):
    """A fleet manifest that cannot be used; the message is one line naming the file and field."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# Upper bounds far past any real machine or build: they only keep a typo (or 1e308) from
# overflowing the placement arithmetic downstream.
class Node(_Frozen):
    """One BuildKit node: the buildx builder that reaches it and its nominal capacity."""

    name: str = Field(min_length=1)
    # The machine: no two nodes share one (two entries would let two builds onto one box).
    builder: str = Field(min_length=1)
    # user@host[:port]; nodes without it are not probed and the figures below stand in.
    ssh: str | None = Field(default=None, min_length=1)
    cores: int = Field(gt=0, le=65_536, strict=True)
    mem_gb: float = Field(gt=0, le=1_000_000, strict=True, allow_inf_nan=False)
    # Upload speed to the registry: pushes dominate on slow links (scheduling-facts §3.2).
    link_mbps: float = Field(gt=0, le=10_000_000, strict=True, allow_inf_nan=False)
    gpus: tuple[str, ...] = ()


class TargetCost(_Frozen):
    """A target's build time and pushed size, measured on the reference node."""

    seconds: float = Field(gt=0, le=10_000_000, strict=True, allow_inf_nan=False)
    size_gb: float = Field(ge=0, le=100_000, strict=True, allow_inf_nan=False)


class Reference(_Frozen):
    """The node the `target_costs` figures were measured on."""

    cores: int = Field(gt=0, le=65_536, strict=True)
    mem_gb: float = Field(gt=0, le=1_000_000, strict=True, allow_inf_nan=False)


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
    def _one_entry_per_machine(cls, nodes: tuple[Node, ...]) -> tuple[Node, ...]:
        if not nodes:
            raise PydanticCustomError("no_nodes", "must list at least one node")
        names: set[str] = set()
        builders: dict[str, int] = {}
        for index, node in enumerate(nodes):
            if node.name in names:
                raise PydanticCustomError(
                    "duplicate_node",
                    "duplicate node name '{name}'",
                    {"name": node.name, "index": index},
                )
            names.add(node.name)
            # One builder, one machine: two entries would be placed as two free machines.
            first = builders.setdefault(node.builder, index)
            if first != index:
                raise PydanticCustomError(
                    "duplicate_builder",
                    "builder '{builder}' is also the builder of another node",
                    {
                        "builder": node.builder,
                        "index": index,
                        "other": nodes[first].name,
                        "other_index": first,
                    },
                )
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
        raise FleetError(f"no node {shown(name)} in the fleet (nodes: {known})")


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
        # Read one byte past the cap: enough to know the file is too big, never the whole of it.
        with resolved.open("rb") as handle:
            data = handle.read(MAX_FLEET_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise FleetError(
            f"{resolved}: cannot read fleet file: {reason} (set {FLEET_FILE_ENV} or pass a path)"
        ) from None
    if len(data) > MAX_FLEET_BYTES:
        raise FleetError(f"{resolved}: larger than {MAX_FLEET_BYTES // 1024} KiB; not a fleet file")
    try:
        text = data.decode("utf-8")
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
        return _parse(text, source)
    except FleetError:
        raise
    except Exception as exc:
        # The boundary: whatever the loader did not foresee is still one line naming the file.
        raise FleetError(
            f"{source}: cannot read the fleet: {type(exc).__name__}: {bounded(str(exc))}"
        ) from exc


def _parse(text: str, source: str) -> Fleet:
    if len(text) > MAX_FLEET_BYTES:
        raise FleetError(f"{source}: larger than {MAX_FLEET_BYTES // 1024} KiB; not a fleet file")
    try:
        doc = yaml.load(text, Loader=_FleetLoader)
    except yaml.MarkedYAMLError as exc:
        raise FleetError(_yaml_error(source, exc)) from None
    except yaml.YAMLError as exc:
        raise FleetError(f"{source}: invalid YAML: {bounded(str(exc))}") from None
    if doc is None:
        raise FleetError(f"{source}: empty file; expected nodes: and target_costs:")
    if not isinstance(doc, dict):
        raise FleetError(f"{source}: expected a mapping with nodes: and target_costs:")
    for key in doc:
        if key not in ("nodes", "target_costs"):
            raise FleetError(f"{source}: {bounded(key)}: unknown key")
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


class _FleetLoader(yaml.SafeLoader):
    """SafeLoader that builds only plain trees of bounded depth with string keys, no repeats.

    Anchors and aliases are refused where the parser meets them, before any node is built: an
    alias bomb is a few hundred bytes whose value, once expanded (even only to quote it in an
    error), fills memory. A fleet is a few short entries, so writing a value out costs nothing.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None,
                None,
                "anchors and aliases (&name, *name) are not supported; write the value out",
                event.start_mark,
            )
        if self._depth >= MAX_FLEET_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_FLEET_DEPTH} levels", event.start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except yaml.YAMLError:
            raise
        except Exception as exc:
            # e.g. `2024-02-30` (a date that does not exist) or an integer past Python's digit
            # limit: the constructor's own error, at the value's line and column.
            raise yaml.constructor.ConstructorError(
                None, None, f"unreadable value: {bounded(str(exc))}", node.start_mark
            ) from exc

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                raise yaml.constructor.ConstructorError(
                    None, None, "merge keys (<<) are not supported", key_node.start_mark
                )
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a string, not a list or mapping", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                # YAML reads `1:`, `null:` and `on:` as a number, null and a boolean.
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"a key must be a string, not {type(key).__name__} {shown(key)}; quote it",
                    key_node.start_mark,
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {shown(key)}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads `1e3` as a string, so `seconds: 1e3` would be "not a number"; YAML 1.2
# and every other tool read it as the float it looks like.
_FleetLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _yaml_error(source: str, exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or exc.context or "unparseable"
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    return f"{where}: invalid YAML: {bounded(problem)}"


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
        return f"nodes[{ctx['index']}].name", f"duplicate node name {shown(ctx['name'])}"
    if kind == "duplicate_builder":
        return (
            f"nodes[{ctx['index']}].builder",
            f"{shown(ctx['builder'])} is also the builder of node {shown(ctx['other'])} "
            f"(nodes[{ctx['other_index']}]); a machine is one entry",
        )
    problems = {
        "missing": "missing",
        "extra_forbidden": "unknown key",
        "greater_than": f"must be > {_figure(ctx.get('gt'))} (got {got})",
        "greater_than_equal": f"must be >= {_figure(ctx.get('ge'))} (got {got})",
        "less_than_equal": f"must be <= {_figure(ctx.get('le'))} (got {got})",
        "finite_number": f"must be a finite number (got {got})",
        "no_nodes": "must list at least one node",
        "string_too_short": "must not be empty",
    }
    problem = problems.get(kind, f"{bounded(str(error['msg'])).lower()} (got {got})")
    return _field_path(loc), problem


def _figure(bound: object) -> str:
    # Bounds come from the models above: 0, or a round upper limit written as int or float.
    return str(int(bound)) if isinstance(bound, float) and bound.is_integer() else str(bound)


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
            name = bounded(str(part))
            path += f".{name}" if path else name
    return path or "(top level)"
