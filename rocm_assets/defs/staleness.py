"""What would rebuild and why, per target and arch: Dagster's own staleness, explained.

Dagster decides (its stale-status resolver, the UI's "unsynced"); this names the cause in the
farm's words: `missing`, `code version changed: args VLLM_REF` (the difference between the
definition the last build recorded and the bake file now), `input pytorch rebuilt`, and for the
partitions downstream of those, `after input vllm`. A tag the registry observation sensor saw
move since the last build says `pushed outside Dagster`.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field

import dagster as dg

from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.build.versions import DEFINITION_METADATA, changes, definitions
from rocm_assets.core.common.constants import NOARCH
from rocm_assets.instance.dagster_internals import (
    AssetKeyPartitionKey,
    BaseAssetGraph,
    StaleCause,
    StaleCauseCategory,
    StaleStatus,
    stale_resolver,
    stale_view,
)

DATA_VERSION_TAG = "dagster/data_version"


@dataclass
class StaleRow:
    """One asset partition that would rebuild: `status` is missing, stale or downstream."""

    target: str
    partition: str | None
    status: str
    reasons: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.target} {self.partition or NOARCH}"

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "partition": self.partition,
            "status": self.status,
            "reasons": self.reasons,
        }


def _latest(
    instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None, observations: bool
) -> dg.EventLogRecord | None:
    records_filter = dg.AssetRecordsFilter(
        asset_key=key, asset_partitions=[partition] if partition else None
    )
    fetch = instance.fetch_observations if observations else instance.fetch_materializations
    records = fetch(records_filter, limit=1).records
    return records[0] if records else None


def _partition_text(key: AssetKeyPartitionKey) -> str:
    name = key.asset_key.to_user_string()
    return name if key.partition_key is None else f"{name} {key.partition_key}"


class _Explainer:
    def __init__(self, instance: dg.DagsterInstance, graph: BakeGraph) -> None:
        self.instance = instance
        self.graph = graph
        self.current = definitions(graph)

    def code(self, key: dg.AssetKey, partition: str | None) -> str:
        record = _latest(self.instance, key, partition, observations=False)
        event = record.asset_materialization if record else None
        recorded = event.metadata.get(DEFINITION_METADATA) if event else None
        if recorded is None:
            return "code version changed (its last build recorded no definition)"
        changed = self._changes(recorded.value, key.to_user_string())
        return f"code version changed: {', '.join(changed)}" if changed else "code version changed"

    def _changes(self, recorded: object, target: str) -> list[str]:
        return changes(recorded if isinstance(recorded, dict) else {}, self.current[target])

    def cause(self, key: dg.AssetKey, partition: str | None, cause: StaleCause) -> str:
        if cause.category == StaleCauseCategory.CODE:
            return self.code(key, partition)
        if cause.dependency is not None and cause.category == StaleCauseCategory.DATA:
            return f"input {_partition_text(cause.dependency)} rebuilt"
        if cause.dependency is not None:
            return f"inputs changed: {cause.reason} ({_partition_text(cause.dependency)})"
        return cause.reason

    def outside_push(self, key: dg.AssetKey, partition: str | None) -> str | None:
        built = _latest(self.instance, key, partition, observations=False)
        seen = _latest(self.instance, key, partition, observations=True)
        if built is None or seen is None or seen.storage_id < built.storage_id:
            return None
        observed = (seen.event_log_entry.tags or {}).get(DATA_VERSION_TAG)
        materialized = (built.asset_materialization.tags or {}).get(DATA_VERSION_TAG)
        if observed and materialized and observed != materialized:
            return f"registry holds {observed}, pushed outside Dagster"
        return None


def _partitions(graph: BakeGraph, target: str) -> Iterator[str | None]:
    yield from graph.arches if target in graph.per_arch else (None,)


def _inputs(
    graph: BakeGraph, target: str, partition: str | None
) -> Iterator[tuple[str, str | None]]:
    """The asset partitions a build of (target, partition) reads, by the assets' mappings."""
    for dep in graph.deps[target]:
        if dep not in graph.per_arch:
            yield dep, None
        elif partition is not None:
            yield dep, partition
        else:
            yield dep, graph.arches[0]


def stale_report(
    instance: dg.DagsterInstance, graph: BakeGraph, asset_graph: BaseAssetGraph
) -> tuple[list[StaleRow], int]:
    """Every asset partition that would rebuild, inputs first, and how many were looked at."""
    view = stale_view(instance, asset_graph)
    resolver = stale_resolver(instance, asset_graph, view)
    explain = _Explainer(instance, graph)
    rows: dict[tuple[str, str | None], StaleRow] = {}
    checked = 0
    for target in graph.asset_targets:
        key = dg.AssetKey(target)
        for partition in _partitions(graph, target):
            checked += 1
            status = resolver.get_status(key, partition)
            row = StaleRow(target, partition, "")
            if status == StaleStatus.MISSING:
                row.status, row.reasons = "missing", ["missing"]
            elif status == StaleStatus.STALE:
                row.status = "stale"
                row.reasons = list(
                    dict.fromkeys(
                        explain.cause(key, partition, c)
                        for c in resolver.get_stale_causes(key, partition)
                    )
                )
            pushed = explain.outside_push(key, partition)
            if pushed:
                row.status = row.status or "stale"
                row.reasons.append(pushed)
            upstream = [dep for dep in _inputs(graph, target, partition) if dep in rows]
            if upstream and not row.status:
                row.status = "downstream"
            row.reasons.extend(
                f"after input {dep}{'' if part is None else ' ' + part}" for dep, part in upstream
            )
            if row.status:
                rows[(target, partition)] = row
    return list(rows.values()), checked
