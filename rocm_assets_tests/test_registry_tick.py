"""The registry observation tick for every asset target x 6 arches: what it asks, what it records.

Its time is a benchmark (bench_registry_tick.py); here are its counts. Real: the shipped
rocm-bake.hcl with GPU_ARCHES topped up to 6 in a temporary copy, the sensor as
`rocm_assets.defs.sensors` builds it, a sqlite instance where every asset partition was
materialized, and Debian's docker-registry (no search API: one tags/list per repository and a
HEAD per tag). The Zot-like fake (real sockets) stands in for Zot's GraphQL search.
"""

from pathlib import Path

import pytest

from rocm_assets.core.bake import BakeGraph
from rocm_assets_tests.helpers.registry_tick import (
    TICK_ARCHES,
    filled_docker_registry,
    filled_zot,
    measure_ticks,
    repositories,
)
from rocm_assets_tests.servers.fakes import FakeZot
from rocm_assets_tests.servers.registry import RegistryServer

REPEATS = 2


def _partitions(graph: BakeGraph) -> int:
    per_arch = len(graph.per_arch & set(graph.asset_targets))
    return per_arch * TICK_ARCHES + len(graph.asset_targets) - per_arch


def test_zot_tick_asks_once_per_repository(zot_fake: FakeZot, tmp_path: Path) -> None:
    graph, digests = filled_zot(zot_fake, tmp_path)
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
    graph, digests = filled_docker_registry(registry_server, tmp_path)
    registry = measure_ticks(
        graph, registry_server.url, registry_server.requests_served, digests, REPEATS
    )
    repos = repositories(digests)
    # The probe that finds no search, a tags/list per repository, a HEAD per tag.
    assert (
        registry["steady_requests"] == registry["first_requests"] == 1 + len(repos) + len(digests)
    )
    assert registry["first_events"] == len(digests) + len(graph.asset_targets)
