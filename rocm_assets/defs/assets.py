"""One asset per bake target, generated from the bake graph: no target or edge is named here."""

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import dagster as dg

from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.build.versions import definitions
from rocm_assets.core.common.constants import (
    FANOUT_PARENT,
    GROUP_TAG_PREFIX,
    ROCM_FANOUT_OF_TAG,
    ROCM_FANOUT_TAG,
    WHEELS_GROUP,
)
from rocm_assets.core.common.names import job_name, op_name
from rocm_assets.defs.automation import rebuild_condition
from rocm_assets.defs.freshness import freshness_policy
from rocm_assets.defs.resources.bake import BakeResource
from rocm_assets.defs.resources.registry import RegistryResource

if TYPE_CHECKING:
    # A type only: importing dagster_internals loads Dagster's SQL storage (0.3 s).
    from rocm_assets.instance.dagster_internals import UnresolvedAssetJobDefinition

ASSET_GROUP = "rocm"


def arch_partitions(graph: BakeGraph) -> dg.StaticPartitionsDefinition:
    """One partition per GPU arch in the bake file's list."""
    return dg.StaticPartitionsDefinition(list(graph.arches))


def _dep(graph: BakeGraph, target: str, upstream: str) -> dg.AssetDep:
    down_arch, up_arch = target in graph.per_arch, upstream in graph.per_arch
    if down_arch and up_arch:
        mapping: dg.PartitionMapping | None = dg.IdentityPartitionMapping()
    elif up_arch:
        # A noarch target builds against the first arch's image (BakeGraph.build_arch).
        mapping = dg.SpecificPartitionsPartitionMapping([graph.arches[0]])
    elif down_arch:
        mapping = dg.AllPartitionMapping()
    else:
        mapping = None
    return dg.AssetDep(dg.AssetKey(upstream), partition_mapping=mapping)


def _description(graph: BakeGraph, target: str) -> str:
    resolved = graph.resolve(graph.arches[0]).targets[target]
    scope = (
        "one GPU arch"
        if target in graph.per_arch
        else f"all arches (noarch; built against {graph.arches[0]})"
    )
    lines = [
        resolved.description
        or f"Bakes `{target}` for {scope} on the placed node and pushes it to the registry.",
        "",
        f"Dockerfile `{resolved.dockerfile}`, defined at {graph.path.name}:{resolved.line}.",
    ]
    return "\n".join(lines)


def build_asset_specs(graph: BakeGraph) -> list[dg.AssetSpec]:
    """The specs: keys, deps, partitions, kinds, tags, freshness, code versions and the
    automation condition, all from the graph."""
    partitions = arch_partitions(graph)
    versions = definitions(graph)
    condition = rebuild_condition()
    specs = []
    for target in graph.asset_targets:
        groups = graph.groups_of(target)
        resolved = graph.resolve(graph.arches[0]).targets[target]
        specs.append(
            dg.AssetSpec(
                key=dg.AssetKey(target),
                deps=[_dep(graph, target, up) for up in graph.deps[target]],
                partitions_def=partitions if target in graph.per_arch else None,
                group_name=ASSET_GROUP,
                kinds={"docker", "wheel"} if WHEELS_GROUP in groups else {"docker"},
                tags={f"{GROUP_TAG_PREFIX}{g}": "" for g in groups},
                description=_description(graph, target),
                metadata={
                    "dockerfile": resolved.dockerfile,
                    "bake_file": f"{graph.path}:{resolved.line}",
                    "bake_groups": dg.MetadataValue.json(list(groups)),
                    "tag_example": resolved.tags[0] if resolved.tags else "",
                },
                freshness_policy=freshness_policy(target),
                # What decides the build (rocm_assets.core.build.versions): a change makes it unsynced.
                code_version=versions[target].version,
                automation_condition=condition,
                # A fanned-out request's own run yields nothing for it (see _materializer).
                skippable=True,
            )
        )
    return specs


def _materializer(target: str) -> Callable[..., Iterator[dg.MaterializeResult]]:
    # A function per target, so each asset bakes its own target (no loop-variable capture).
    def materialize(
        context: dg.AssetExecutionContext, bake: BakeResource, registry: RegistryResource
    ) -> Iterator[dg.MaterializeResult]:
        if context.run.tags.get(ROCM_FANOUT_TAG) == FANOUT_PARENT:
            # The coordinator split this request into one placed run per build; this run only
            # records the request, so it yields nothing and its downstream steps are skipped.
            context.log.info(
                "fanned out: %s builds in runs tagged %s=%s",
                target,
                ROCM_FANOUT_OF_TAG,
                context.run.run_id,
            )
            return
        yield bake.materialize(context, target, registry)

    return materialize


def build_bake_assets(graph: BakeGraph) -> list[dg.AssetsDefinition]:
    """One materializable asset per spec; each materialization is one bake of its target."""
    return [
        dg.multi_asset(specs=[spec], name=op_name(spec.key.to_user_string()))(
            _materializer(spec.key.to_user_string())
        )
        for spec in build_asset_specs(graph)
    ]


def build_jobs(graph: BakeGraph) -> list["UnresolvedAssetJobDefinition"]:
    """A job per bake group, and one per asset target outside every group (bake's own targets)."""
    jobs = [
        dg.define_asset_job(
            job_name(group),
            selection=dg.AssetSelection.assets(
                *(dg.AssetKey(t) for t in members if t in graph.asset_targets)
            ),
            description=f"The bake group `{group}`: {', '.join(members)}.",
        )
        for group, members in graph.groups.items()
    ]
    jobs.extend(
        # `_job`: the bare name is already the asset's op.
        dg.define_asset_job(
            f"{job_name(target)}_job",
            selection=dg.AssetSelection.assets(dg.AssetKey(target)),
            description=f"`{target}` alone: it is in no bake group.",
        )
        for target in graph.asset_targets
        if not graph.groups_of(target)
    )
    return jobs
