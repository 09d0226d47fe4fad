"""The registry inside build runs: the preflight of a run's builds, and the digest check.

`preflight_run` is called by every build step before anything else; the first step of a run
checks the whole run and records it on the run, so the others skip it. `registry_digest_matches`
is one asset check per asset: for each arch partition Dagster materialized, it compares the
digest of its tag in the registry with the data version of its last materialization. A build run
executes it after the build (the tags must hold what was pushed); the observation sensor reports
it runless when the two start or stop disagreeing, e.g. after a push outside Dagster.
"""

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dagster as dg

from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.build.builds import Build, builds_for
from rocm_assets.core.build.invocation import REGISTRY_RETRY_S, retry_delay
from rocm_assets.core.common.constants import NOARCH, REGISTRY_DIGEST_CHECK, ROCM_PREFLIGHT_TAG
from rocm_assets.core.common.timefmt import duration
from rocm_assets.core.registry.errors import ImageInfo, RegistryError
from rocm_assets.core.registry.preflight import PreflightReport, preflight
from rocm_assets.defs.resources.registry import RegistryResource

if TYPE_CHECKING:
    from rocm_assets.core.registry.client import RegistryClient

# Dagster's event tag for a data version (an AssetObservation has no data_version argument).
DATA_VERSION_TAG = "dagster/data_version"
CHECK_DESCRIPTION = (
    "For every arch partition materialized in Dagster, the registry's digest for its tag equals "
    "the data version of its last materialization. It fails when a tag was pushed outside "
    "Dagster (make push-all, a manual push) or deleted."
)


@dataclass(frozen=True)
class Entry:
    """One asset partition (None: a noarch asset) and the tags its build pushes."""

    target: str
    partition: str | None
    tags: tuple[str, ...]

    @property
    def label(self) -> str:
        return self.partition or NOARCH

    @property
    def key(self) -> str:
        return f"{self.target}@{self.label}"


@dataclass(frozen=True)
class DigestRow:
    """A materialized asset partition: its tag, the registry's digest (None: absent), Dagster's."""

    partition: str
    tag: str
    registry: str | None
    materialized: str


def entries(graph: BakeGraph, targets: Iterable[str] | None = None) -> list[Entry]:
    return [
        Entry(target, partition, graph.tags(target, partition))
        for target in (graph.asset_targets if targets is None else targets)
        for partition in (graph.arches if target in graph.per_arch else (None,))
    ]


def read_registry(
    client: "RegistryClient", wanted: Iterable[Entry]
) -> tuple[dict[Entry, tuple[str, ImageInfo | None]], list[str]]:
    """Per entry, its tag on this registry and what is there; the tags on other hosts.

    One `repo_images` per repository: on Zot one request answers for every tag of it.
    """
    located: dict[Entry, tuple[str, str, str]] = {}
    foreign = []
    for entry in wanted:
        tag = next((t for t in entry.tags if client.is_local(t)), None)
        if tag is None:
            foreign.extend(entry.tags[:1])
            continue
        located[entry] = (tag, *client.split_ref(tag))
    images = {
        repo: client.repo_images(repo) for repo in sorted({r for _, r, _ in located.values()})
    }
    found = {entry: (tag, images[repo].get(ref)) for entry, (tag, repo, ref) in located.items()}
    return found, foreign


def latest_built_digest(
    instance: dg.DagsterInstance, target: str, partition: str | None
) -> str | None:
    """The data version (the pushed digest) of the asset partition's last materialization."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey(target), asset_partitions=[partition] if partition else None
        ),
        limit=1,
    ).records
    if not records or records[0].asset_materialization is None:
        return None
    # A materialization reported by hand may carry no tags at all.
    return (records[0].asset_materialization.tags or {}).get(DATA_VERSION_TAG)


def latest_built_digests(
    instance: dg.DagsterInstance, target: str, partitions: Sequence[str]
) -> dict[str, str]:
    """Per arch partition, what `latest_built_digest` gives, in one query for all of them.

    A query per partition made the sensor's tick grow with arches (80 queries, most of a
    0.5 s tick, for 6 arches). The data version tag is one Dagster indexes per event, and this
    reads it from each partition's latest materialization, as `latest_built_digest` does.
    """
    latest = instance.event_log_storage.get_latest_tags_by_partition(
        dg.AssetKey(target),
        dg.DagsterEventType.ASSET_MATERIALIZATION,
        [DATA_VERSION_TAG],
        asset_partitions=list(partitions),
    )
    return {p: tags[DATA_VERSION_TAG] for p, tags in latest.items() if DATA_VERSION_TAG in tags}


def digest_rows(
    instance: dg.DagsterInstance, found: dict[Entry, tuple[str, ImageInfo | None]]
) -> dict[str, list[DigestRow]]:
    """Per target, a row for each of its partitions that Dagster materialized with a digest."""
    partitions: dict[str, list[str]] = {}
    for entry in found:
        if entry.partition is not None:
            partitions.setdefault(entry.target, []).append(entry.partition)
    built_by_arch = {t: latest_built_digests(instance, t, ps) for t, ps in partitions.items()}
    rows: dict[str, list[DigestRow]] = {}
    for entry, (tag, info) in found.items():
        built = (
            built_by_arch[entry.target].get(entry.partition)
            if entry.partition is not None
            else latest_built_digest(instance, entry.target, None)
        )
        if built is not None:
            row = DigestRow(entry.label, tag, info.digest if info else None, built)
            rows.setdefault(entry.target, []).append(row)
    return rows


def digest_check_fields(rows: Sequence[DigestRow]) -> dict[str, Any]:
    """passed, description, metadata and severity of one evaluation, run or sensor alike.

    One evaluation covers all of an asset's partitions: Dagster 1.13 stores a runless check
    evaluation only once per partition (a unique index on asset, check, run "" and partition),
    so per-partition evaluations could not report a second change.
    """
    wrong = [row for row in rows if row.registry != row.materialized]
    if not rows:
        description = "never materialized with a digest: nothing to compare"
    elif not wrong:
        description = (
            f"the materialized tag {rows[0].tag} holds the image Dagster built"
            if len(rows) == 1
            else f"all {len(rows)} materialized tags hold the images Dagster built"
        )
    else:
        description = "; ".join(
            f"{row.tag} is not in the registry, but was materialized as {row.materialized}"
            if row.registry is None
            else f"{row.tag} is {row.registry} in the registry but was materialized as "
            f"{row.materialized}: pushed outside Dagster"
            for row in wrong
        )
    digests = {
        row.partition: {
            "tag": row.tag,
            "registry_digest": row.registry,
            "materialized_digest": row.materialized,
        }
        for row in rows
    }
    return {
        "passed": bool(rows) and not wrong,
        "description": description,
        "metadata": {
            "mismatched": dg.MetadataValue.json([row.partition for row in wrong]),
            "digests": dg.MetadataValue.json(digests),
        },
        # The image in the registry still works; what it no longer is, is the one Dagster built.
        "severity": dg.AssetCheckSeverity.WARN,
    }


def _registry_check(graph: BakeGraph, target: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=dg.AssetKey(target), name=REGISTRY_DIGEST_CHECK, description=CHECK_DESCRIPTION
    )
    def registry_digest_matches(
        context: dg.AssetCheckExecutionContext, registry: RegistryResource
    ) -> dg.AssetCheckResult:
        try:
            with registry.client(warn=context.log.warning) as client:
                found, foreign = read_registry(client, entries(graph, [target]))
        except RegistryError as exc:
            # Not evaluated is not failed: an error never says present or absent.
            raise dg.Failure(
                description=f"could not read {target} from the registry: {exc}"
            ) from None
        if not found:
            raise dg.Failure(
                description=f"{target} pushes no tag to the registry {registry.url} "
                f"(e.g. {foreign[0]}): REGISTRY must name the registry ROCM_REGISTRY_URL points at"
            )
        rows = digest_rows(context.instance, found).get(target, [])
        return dg.AssetCheckResult(**digest_check_fields(rows))

    return registry_digest_matches


def build_registry_checks(graph: BakeGraph) -> list[dg.AssetChecksDefinition]:
    """`registry_digest_matches` on every asset; `graph` evaluated with bake's environment.

    Executed after a build in the same run, it confirms the tags hold what was pushed; the
    observation sensor reports it runless when the registry moves.
    """
    return [_registry_check(graph, target) for target in graph.asset_targets]


def run_builds(context: dg.AssetExecutionContext, graph: BakeGraph) -> list[Build]:
    """Every build of the run: its selected assets times its partitions."""
    # context.selected_asset_keys is this step's asset only; the run's selection is the job's.
    selected = context.job_def.asset_layer.selected_asset_keys
    targets = [t for t in graph.targets if dg.AssetKey(t) in selected]
    partitioned = context.has_partition_key or context.has_partition_key_range
    return builds_for(graph, targets, context.partition_keys if partitioned else [])


def preflight_run(
    context: dg.AssetExecutionContext, registry: RegistryResource, graph: BakeGraph
) -> None:
    """Fail the step, before any build, when an input of the run's builds is not published.

    `graph` must be evaluated with this process's environment, as bake is (`load_graph`'s
    default), so the images checked are the ones bake will pull.
    """
    run_id = context.run.run_id
    run = context.instance.get_run_by_id(run_id)
    if run is not None and run.tags.get(ROCM_PREFLIGHT_TAG) == run_id:
        return
    builds = run_builds(context, graph)
    report = _preflight_through_outages(context, registry, graph, builds)
    if report.missing:
        lines = [m.line() for m in report.missing]
        raise dg.Failure(
            description="\n".join([*lines, report.summary()]),
            metadata={
                "missing": dg.MetadataValue.json([m.to_json() for m in report.missing]),
                "checked": report.checked,
            },
        )
    context.log.info(report.summary())
    context.instance.add_run_tags(run_id, {ROCM_PREFLIGHT_TAG: run_id})


def _preflight_through_outages(
    context: dg.AssetExecutionContext,
    registry: RegistryResource,
    graph: BakeGraph,
    builds: list[Build],
) -> PreflightReport:
    """The preflight; a registry that cannot be reached or answers 5xx is asked again, as a
    bake's push is (`run_bake`), so a run placed during an outage under the bound still builds."""
    first_failure: float | None = None
    attempt = 0
    while True:
        try:
            with registry.client(warn=context.log.warning) as client:
                _same_registry(graph, builds, client)
                return preflight(graph, builds, client)
        except RegistryError as exc:
            now = time.monotonic()
            first_failure = first_failure or now
            attempt += 1
            delay = retry_delay(attempt)
            if not exc.transient or now + delay - first_failure > REGISTRY_RETRY_S:
                raise dg.Failure(
                    description=f"preflight could not check the run's inputs, no build started: {exc}"
                ) from None
            context.log.warning(
                f"preflight could not reach the registry ({exc}); attempt {attempt + 1} in "
                f"{delay:.0f}s, retried for {duration(REGISTRY_RETRY_S)} after the first failure"
            )
            time.sleep(delay)


def _same_registry(graph: BakeGraph, builds: list[Build], client: "RegistryClient") -> None:
    """Bake pushes to the graph's REGISTRY; a check of another registry would prove nothing."""
    for build in builds:
        for tag in graph.tags(build.target, build.arch):
            if not client.is_local(tag):
                raise dg.Failure(
                    description=(
                        f"{build.target} pushes {tag}, which is not on the registry {client.url} that "
                        "preflight and the observation sensor read: set REGISTRY to that host "
                        "or ROCM_REGISTRY_URL to this one"
                    )
                )
