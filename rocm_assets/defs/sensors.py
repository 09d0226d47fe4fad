"""The registry observation sensor: what is in Zot, whoever pushed it, as asset observations.

Each tick reads every repository the assets publish to once (`repo_images`: one GraphQL request
on Zot), so requests grow with repositories, not with tags times arches. It emits, only for what
changed since the cursor:

- an `AssetObservation` per asset partition whose tag appeared or moved, with the digest as its
  data version and tag, digest and push time (when the registry gives one) as metadata;
- an observation with `absent: True` when a tag it had seen is gone from the listing (the
  registry answered; an error never gets here), after which the entry leaves the cursor;
- a `registry_digest_matches` evaluation for an asset when, over its partitions, the registry's
  digests and its last materializations start or stop disagreeing (a push outside Dagster).

A registry that is down or refuses the tick gives a SkipReason and leaves the cursor unchanged,
so nothing is reported absent for an error and the next good tick reports what it missed. Every
tick starts no runs, so the UI lists each as skipped with its one-line reason: ROCM_REGISTRY_URL
unset, the registry unreachable or refusing (with the cause), REGISTRY naming another registry,
no change, or what it observed.

Cursor (JSON): {"seen": {"target@arch": digest}, "checks": {target: [[arch, registry, built]]}};
noarch targets use the arch `noarch`.
"""

import json
from dataclasses import dataclass

import dagster as dg

from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.common.constants import REGISTRY_DIGEST_CHECK
from rocm_assets.core.registry.errors import RegistryError
from rocm_assets.defs.registry_checks import (
    DATA_VERSION_TAG,
    digest_check_fields,
    digest_rows,
    entries,
    read_registry,
)
from rocm_assets.defs.resources.registry import RegistryResource

SENSOR_NAME = "registry_observation_sensor"

Event = dg.AssetObservation | dg.AssetCheckEvaluation


@dataclass
class _Cursor:
    seen: dict[str, str]
    checks: dict[str, list[list[str | None]]]

    @classmethod
    def load(cls, text: str | None) -> "_Cursor":
        data = json.loads(text) if text else {}
        return cls(dict(data.get("seen", {})), dict(data.get("checks", {})))

    def dump(self) -> str:
        return json.dumps({"seen": self.seen, "checks": self.checks}, sort_keys=True)


def build_registry_observation_sensor(
    graph: BakeGraph,
    *,
    minimum_interval_seconds: int = 60,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
) -> dg.SensorDefinition:
    """The sensor for every asset target and arch partition of `graph`.

    `graph` must be evaluated with the environment bake runs with (REGISTRY, SDE_* ...), so the
    tags it watches are the tags builds push. RUNNING by default: it starts no runs and only
    reads the registry, and a stopped one would let pushes outside Dagster go unseen.
    """
    watched = entries(graph)

    @dg.sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=(
            "Observes every asset's tag in the registry (digest, push time) and flags tags "
            "whose digest is not the last materialization's."
        ),
    )
    def registry_observation_sensor(
        context: dg.SensorEvaluationContext, registry: RegistryResource
    ) -> dg.SensorResult | dg.SkipReason:
        try:
            cursor = _Cursor.load(context.cursor)
        except (ValueError, TypeError, AttributeError):
            context.log.warning("unreadable cursor %r: observing every tag afresh", context.cursor)
            cursor = _Cursor({}, {})
        try:
            with registry.client(warn=context.log.warning) as client:
                found, foreign = read_registry(client, watched)
                requests, url = client.requests, client.url
        except RegistryError as exc:
            return dg.SkipReason(f"registry not read, nothing changed: {exc}")
        if not found and not foreign:
            return dg.SkipReason("no asset target has a tag in the bake file: nothing to observe")
        if not found:
            return dg.SkipReason(
                f"no asset's tag is on the registry {url} (e.g. {foreign[0]}): REGISTRY must "
                "name the registry ROCM_REGISTRY_URL points at"
            )
        if foreign:
            context.log.warning("%d tags are not on %s, not observed", len(foreign), url)
        events: list[Event] = []
        seen: dict[str, str] = {}
        for entry, (tag, info) in found.items():
            if info is not None:
                seen[entry.key] = info.digest
                if cursor.seen.get(entry.key) != info.digest:
                    metadata: dict[str, str | dg.MetadataValue] = {
                        "tag": tag,
                        "digest": info.digest,
                    }
                    if info.pushed_at is not None:
                        metadata["pushed_at"] = dg.MetadataValue.timestamp(info.pushed_at)
                    events.append(
                        dg.AssetObservation(
                            asset_key=dg.AssetKey(entry.target),
                            partition=entry.partition,
                            metadata=metadata,
                            tags={DATA_VERSION_TAG: info.digest},
                        )
                    )
            elif entry.key in cursor.seen:
                events.append(
                    dg.AssetObservation(
                        asset_key=dg.AssetKey(entry.target),
                        partition=entry.partition,
                        metadata={
                            "tag": tag,
                            "absent": True,
                            "last_digest": cursor.seen[entry.key],
                        },
                    )
                )
        checks: dict[str, list[list[str | None]]] = {}
        for target, rows in digest_rows(context.instance, found).items():
            checks[target] = [[row.partition, row.registry, row.materialized] for row in rows]
            if cursor.checks.get(target) != checks[target]:
                events.append(
                    dg.AssetCheckEvaluation(
                        asset_key=dg.AssetKey(target),
                        check_name=REGISTRY_DIGEST_CHECK,
                        **digest_check_fields(rows),
                    )
                )
        new_cursor = _Cursor(seen, checks).dump()
        if not events:
            # The cursor still moves: a tag that left the watched set leaves it too.
            return dg.SensorResult(
                skip_reason=f"no change in {url}: {len(seen)} tags present, {requests} requests",
                cursor=new_cursor,
            )
        context.log.info("%d registry events, %d requests to %s", len(events), requests, url)
        # A tick that starts no run is shown as skipped: without a reason the UI would say
        # "Sensor function returned an empty result" for a tick that reported events.
        return dg.SensorResult(
            asset_events=events, cursor=new_cursor, skip_reason=_reported(events, url, requests)
        )

    return registry_observation_sensor


def _reported(events: list[Event], url: str, requests: int) -> str:
    """What a tick reported, in one line: it starts no runs, so this is its reason in the UI."""
    observations = [e for e in events if isinstance(e, dg.AssetObservation)]
    gone = sum(1 for e in observations if "absent" in e.metadata)
    checks = len(events) - len(observations)
    return (
        f"observed {len(observations) - gone} new or moved tags and {gone} gone, "
        f"{checks} digest check results, from {url} in {requests} requests; no runs to start"
    )
