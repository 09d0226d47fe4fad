"""Declarative automation: rebuild what is missing or out of date, inputs first.

A partition is requested when it has never been built, or when Dagster holds it out of date
("unsynced": its code version changed since its last materialization, or an input's pushed
digest did), and only when none of its inputs is itself missing, out of date, in progress or
failed. So a pin bump rebuilds its targets, then their dependents tick by tick, per arch, and
nothing else; a rebuilt input whose digest did not change (a cache hit) makes nothing stale.

The sensor runs in the code server (the out-of-date test is Python of ours) and is on by
default. `ROCM_AUTOMATION=off` starts it stopped; `ROCM_AUTOMATION_OFF_GROUPS=serving,wheels`
leaves the assets of those bake groups to hand.
"""

import os

import dagster as dg

from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.common.constants import GROUP_TAG_PREFIX

SENSOR_NAME = "rebuild_automation_sensor"
AUTOMATION_ENV = "ROCM_AUTOMATION"
OFF_GROUPS_ENV = "ROCM_AUTOMATION_OFF_GROUPS"
INTERVAL_ENV = "ROCM_AUTOMATION_INTERVAL_S"
DEFAULT_INTERVAL_S = 30
_OFF_VALUES = frozenset({"0", "off", "false", "no"})


class OutOfDate(dg.AutomationCondition):
    """The candidate partitions Dagster reports stale (the UI's "unsynced"), by its own resolver:
    the code version, or an input's data version, differs from the last materialization's."""

    @property
    def name(self) -> str:
        return "out_of_date"

    def evaluate(self, context: dg.AutomationContext) -> dg.AutomationResult:  # type: ignore[override]
        # Evaluated by the sensor only: the code location loads without the instance side.
        from rocm_assets.instance.dagster_internals import StaleStatus, stale_resolver

        view = context.asset_graph_view
        resolver = stale_resolver(view.instance, context.asset_graph, view)
        stale = {
            candidate
            for candidate in context.candidate_subset.expensively_compute_asset_partitions()
            if resolver.get_status(candidate.asset_key, candidate.partition_key)
            == StaleStatus.STALE
        }
        return dg.AutomationResult(
            context, view.get_asset_subset_from_asset_partitions(context.key, stale)
        )


def rebuild_condition() -> dg.AutomationCondition:
    """Missing or out of date, not in progress or just failed, with every input settled."""
    unsettled = (
        dg.AutomationCondition.missing()
        | OutOfDate()
        | dg.AutomationCondition.in_progress()
        | dg.AutomationCondition.execution_failed()
    )
    return (
        (dg.AutomationCondition.missing() | OutOfDate())
        & ~dg.AutomationCondition.in_progress()
        # A failed build waits for a person: requesting it again each tick would loop.
        & ~dg.AutomationCondition.execution_failed()
        & ~dg.AutomationCondition.any_deps_match(unsettled)
    ).with_label("rebuild when missing or out of date, inputs first")


def off_groups(env: dict[str, str] | None = None) -> tuple[str, ...]:
    raw = (os.environ if env is None else env).get(OFF_GROUPS_ENV, "")
    return tuple(g.strip() for g in raw.split(",") if g.strip())


def build_automation_sensor(
    graph: BakeGraph, env: dict[str, str] | None = None
) -> dg.AutomationConditionSensorDefinition:
    """The sensor that evaluates every asset's condition; the groups turned off are left out."""
    source = os.environ if env is None else env
    unknown = [g for g in off_groups(dict(source)) if g not in graph.groups]
    if unknown:
        raise ValueError(
            f"{OFF_GROUPS_ENV}: no bake group {', '.join(map(repr, unknown))} in {graph.path} "
            f"(groups: {', '.join(graph.groups)})"
        )
    target = dg.AssetSelection.all()
    for group in off_groups(dict(source)):
        target = target - dg.AssetSelection.tag(f"{GROUP_TAG_PREFIX}{group}", "")
    status = (
        dg.DefaultSensorStatus.STOPPED
        if source.get(AUTOMATION_ENV, "").strip().lower() in _OFF_VALUES
        else dg.DefaultSensorStatus.RUNNING
    )
    return dg.AutomationConditionSensorDefinition(
        SENSOR_NAME,
        target=target,
        default_status=status,
        minimum_interval_seconds=int(source.get(INTERVAL_ENV) or DEFAULT_INTERVAL_S),
        use_user_code_server=True,
        # One run per request, each placed by the coordinator as any other run.
        emit_backfills=False,
        description=(
            "Requests every missing or out-of-date asset partition, inputs before dependents. "
            f"Off groups: {OFF_GROUPS_ENV}; stopped by default with {AUTOMATION_ENV}=off."
        ),
    )
