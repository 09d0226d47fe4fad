"""The registry observation tick for every asset target x 6 arches: what it asks, what it records.

Its time is a benchmark (bench_registry_tick.py); here are its counts. Real: the shipped
rocm-bake.hcl with GPU_ARCHES topped up to 6 in a temporary copy, the sensor as
`rocm_assets.defs.sensors` builds it, a sqlite instance where every asset partition was
materialized, and Debian's docker-registry (no search API: one tags/list per repository and a
HEAD per tag). The Zot-like fake (real sockets) stands in for Zot's GraphQL search.
"""

from pathlib import Path

import pytest

from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets_tests.helpers import PROJECT_ROOT
from rocm_assets_tests.helpers.registry_tick import (
    PUSHED_AT,
    TICK_ARCHES,
    fill_registry,
    measure_ticks,
    tick_bake_file,
)
from rocm_assets_tests.servers.fakes import FakeZot
from rocm_assets_tests.servers.registry import RegistryServer

REPEATS = 2


def _graph(tmp_path: Path, host: str, namespace: str = "rocm-pytorch") -> BakeGraph:
    graph = load_graph(
        tick_bake_file(PROJECT_ROOT / "rocm-bake.hcl", tmp_path),
        {
            "REGISTRY": host,
            "NAMESPACE": namespace,
        },
    )
    assert len(graph.arches) == TICK_ARCHES
    return graph


def _partitions(graph: BakeGraph) -> int:
    per_arch = len(graph.per_arch & set(graph.asset_targets))
    return per_arch * TICK_ARCHES + len(graph.asset_targets) - per_arch


def test_zot_tick_asks_once_per_repository(zot_fake: FakeZot, tmp_path: Path) -> None:
    graph = _graph(tmp_path, zot_fake.host)
    digests = fill_registry(
        graph, zot_fake.host, lambda repo, tag: zot_fake.put(repo, tag, pushed_at=PUSHED_AT)
    )
    assert len(digests) == _partitions(graph)
    zot = measure_ticks(graph, zot_fake.url, lambda: len(zot_fake.log), digests, REPEATS)
    repos = len(zot_fake.repos)
    # GraphQL: one request per repository (the first may add the search probe), steady or not.
    assert zot["first_requests"] <= repos + 1 and zot["steady_requests"] <= repos
    # The first tick observes every tag and evaluates every asset's digest check.
    assert zot["first_events"] == len(digests) + len(graph.asset_targets)


@pytest.mark.real
def test_docker_registry_tick_lists_then_heads_every_tag(
    registry_server: RegistryServer, tmp_path: Path
) -> None:
    namespace = registry_server.new_repo("rocm-pytorch")
    graph = _graph(tmp_path, registry_server.host, namespace)
    digests = fill_registry(
        graph,
        registry_server.host,
        lambda repo, tag: registry_server.push_image(repo, tag, tag.encode()),
    )
    registry = measure_ticks(
        graph, registry_server.url, registry_server.requests_served, digests, REPEATS
    )
    repos = {ref.split("/", 1)[1].split(":")[0] for ref in digests}
    # The probe that finds no search, a tags/list per repository, a HEAD per tag.
    assert (
        registry["steady_requests"] == registry["first_requests"] == 1 + len(repos) + len(digests)
    )
    assert registry["first_events"] == len(digests) + len(graph.asset_targets)
