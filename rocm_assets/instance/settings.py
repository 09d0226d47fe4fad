"""The coordinator's settings, declared once: each is a field below (or a `knob` of the plan
follower's `FollowSettings`), with its default and its description, and dagster.yaml's schema
and the coordinator's constructor both follow from those fields."""

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

import dagster as dg

from rocm_assets.core import placement
from rocm_assets.core.nodes.foreign import FOREIGN_BUILD_DEFAULT_S
from rocm_assets.core.placement.farm import FollowSettings, knob
from rocm_assets.core.placement.follow import COORDINATOR_STRATEGY

STRATEGIES = (COORDINATOR_STRATEGY, *placement.STRATEGIES)


@dataclass(frozen=True)
class CoordinatorSettings:
    """What `PlacementRunCoordinator` is configured with. `follow` is flat in dagster.yaml."""

    bake_file: str | None = knob(None, "Bake file. Default: $ROCM_BAKE_FILE, else ./rocm-bake.hcl.")
    fleet_file: str | None = knob(
        None, "Fleet manifest. Default: $ROCM_FLEET_FILE, else ./fleet.yaml."
    )
    strategy: str = knob(
        COORDINATOR_STRATEGY,
        "coordinator: follow the best plan found (the heuristics at once, CP-SAT in the "
        "background), re-planned on drift. Or re-decide every tick with one heuristic: default "
        "(the best of the three), greedy (the seed's rule), critical-path, peft.",
        choices=STRATEGIES,
    )
    follow: FollowSettings = field(default_factory=FollowSettings)
    # False, or OR-Tools missing: the follower plans with the heuristics alone.
    solver: bool = knob(True, "False: the plan is the heuristics' alone (no CP-SAT).")
    # One CP-SAT thread leaves the other cores to the daemon and the UI.
    solver_workers: int = knob(
        1, "CP-SAT threads in the daemon; the daemon's tick never waits for them."
    )
    probe_interval_seconds: int = knob(60, "How often the daemon probes the nodes over SSH.")
    probe_max_age_seconds: int = knob(
        300, "Older probe results are ignored and the fleet's figures stand in."
    )
    probe_nodes: bool = knob(True, "False: never probe; use the fleet's figures.")
    lease_seconds: int = knob(
        300,
        "A started build whose worker stops renewing its builder claim for this long is taken "
        "as dead: its builder is freed and its run failed.",
    )
    input_wait_seconds: int = knob(
        0,
        "How long a build waits on an input whose last run failed or was cancelled (for someone "
        "to rebuild it) before it fails, naming the input and that run. Default 0: it fails at "
        "once, so nothing queues behind a failed input.",
    )
    bake_end_wait_seconds: int = knob(
        60,
        "A run that ended still holding its builder (its worker died mid-bake) keeps it until "
        "the builder's BuildKit history shows no running build of the run, or for this long at "
        "most, when the builder is freed anyway.",
    )
    foreign_check_seconds: float = knob(
        2.0,
        "How often each builder's BuildKit history is read for builds that are not this farm's "
        "(a sibling project's, another farm's, a bake by hand): such a build holds its node. "
        "0: never read; only this farm's runs hold nodes.",
    )
    foreign_build_seconds: int = knob(
        FOREIGN_BUILD_DEFAULT_S,
        "How long a build that is not this farm's is expected to take when the cost model "
        "cannot estimate it (unnamed, or a target the fleet gives no cost); the plan is re-made "
        "when it ends.",
    )

    @classmethod
    def names(cls) -> frozenset[str]:
        """Every setting's name in dagster.yaml."""
        return frozenset(name for _, name, _ in _settings())

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Self:
        """The settings dagster.yaml gave (validated by `config_schema`), defaults for the rest."""
        mine = {k: v for k, v in config.items() if k in _fields(cls)}
        follow = {k: v for k, v in config.items() if k in _fields(FollowSettings)}
        if mine.get("strategy", COORDINATOR_STRATEGY) not in STRATEGIES:
            # dagster.yaml's Enum already refuses it; a direct construction gets the same word.
            raise placement.PlacementError(f"unknown placement strategy {mine['strategy']!r}")
        return cls(**mine, follow=FollowSettings(**follow))

    @classmethod
    def config_schema(cls) -> dict[str, dg.Field]:
        """dagster.yaml's `run_coordinator.config` fields, from the declarations."""
        return {name: _config_field(f, hint) for f, name, hint in _settings()}


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("doc")}


def _settings() -> list[tuple[dataclasses.Field, str, Any]]:
    """(field, name, type) of every setting, this class's and the follower's documented knobs."""
    found = []
    for cls in (CoordinatorSettings, FollowSettings):
        hints = typing.get_type_hints(cls)
        found.extend((f, name, hints[name]) for name, f in _fields(cls).items())
    return found


# The Dagster type of each Python one; integers (seconds) may come from env vars, as Dagster's
# own integer settings may.
_SCALARS: dict[type, Any] = {bool: bool, int: dg.IntSource, float: float, str: dg.StringSource}


def _config_field(f: dataclasses.Field, hint: Any) -> dg.Field:
    doc, choices = f.metadata["doc"], f.metadata["choices"]
    args = typing.get_args(hint)
    optional = isinstance(hint, types.UnionType) and type(None) in args
    base = next(a for a in args if a is not type(None)) if optional else hint
    if choices:
        kind: Any = dg.Enum("PlacementStrategy", [dg.EnumValue(c) for c in choices])
    else:
        kind = _SCALARS[base]
    if f.default is None:
        return dg.Field(kind, is_required=False, description=doc)
    return dg.Field(
        dg.Noneable(kind) if optional else kind, default_value=f.default, description=doc
    )
