"""The registry observation tick as its benchmark and its test drive it.

The sensor for every asset target x 6 arches: a copy of the bake file with GPU_ARCHES topped up
(`tick_bake_file`), a registry holding every watched tag (`fill_registry`), a farm where every
asset partition was materialized (`materialize_all`), and ticks with and without a cursor.
"""

import re
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.common.constants import ARCH_LIST_ATTR
from rocm_assets.defs.registry_checks import DATA_VERSION_TAG, entries
from rocm_assets.defs.resources.registry import RegistryResource
from rocm_assets.defs.sensors import build_registry_observation_sensor
from rocm_assets_tests.helpers import PROJECT_ROOT
from rocm_assets_tests.servers.fakes import FakeZot
from rocm_assets_tests.servers.registry import RegistryServer

# The registry tick watches this many arches; the shipped file's list is topped up from these.
TICK_ARCHES = 6
EXTRA_ARCHES = ("gfx1151", "gfx1200", "gfx1101", "gfx90a", "gfx1030", "gfx908")
# What the Zot-like fake gives as every image's push time.
PUSHED_AT = 1_790_000_000.0


def tick_bake_file(path: Path, out_dir: Path, arches: int = TICK_ARCHES) -> Path:
    """A copy of the bake file at `path`, written to `out_dir`, whose arch list is topped up to
    `arches` from EXTRA_ARCHES (the shipped file is never edited)."""
    text = path.read_text()
    # Either a top-level `GPU_ARCHES = [...]` or the default of `variable "GPU_ARCHES"`.
    pattern = re.compile(
        rf'^(\s*{ARCH_LIST_ATTR}\s*=\s*\[|variable\s+"{ARCH_LIST_ATTR}"\s*{{\s*default\s*=\s*\[)'
        r"([^\]]*)\]",
        re.MULTILINE,
    )
    match = pattern.search(text)
    if match is None:
        raise AssertionError(f"{path}: no `{ARCH_LIST_ATTR} = [...]` list to add arches to")
    present = re.findall(r'"([^"]*)"', match[2])
    extra = [a for a in EXTRA_ARCHES if a not in present][: max(0, arches - len(present))]
    items = ", ".join([match[2].strip().rstrip(","), *(f'"{a}"' for a in extra)])
    out = out_dir / path.name
    out.write_text(f"{text[: match.start()]}{match[1]}{items}]{text[match.end() :]}")
    return out


class SensorTicker:
    """The sensor daemon's part for one registry: evaluate the sensor with a cursor and record
    what it emits in the instance. Only the evaluation is timed; the daemon stores the events
    after it."""

    def __init__(self, graph: BakeGraph, instance: dg.DagsterInstance, url: str) -> None:
        self.sensor = build_registry_observation_sensor(graph)
        self.instance = instance
        self.registry = RegistryResource(url=url, retries=0)

    def tick(self, cursor: str | None) -> tuple[float, dg.SensorResult]:
        with dg.build_sensor_context(
            instance=self.instance, cursor=cursor, resources={"registry": self.registry}
        ) as context:
            started = time.perf_counter()
            result = self.sensor(context)
            seconds = time.perf_counter() - started
        if not isinstance(result, dg.SensorResult):
            raise AssertionError(f"the registry tick did not read the registry: {result}")
        return seconds, result


def tick_graph(out_dir: Path, host: str, namespace: str = "rocm-pytorch") -> BakeGraph:
    """The shipped bake file, topped up to TICK_ARCHES in a copy under `out_dir`, evaluated for
    the registry at `host`."""
    bake = tick_bake_file(PROJECT_ROOT / "rocm-bake.hcl", out_dir)
    graph = load_graph(bake, {"REGISTRY": host, "NAMESPACE": namespace})
    if len(graph.arches) != TICK_ARCHES:
        raise AssertionError(f"{bake}: {len(graph.arches)} arches, not {TICK_ARCHES}")
    return graph


def filled_zot(zot: FakeZot, out_dir: Path) -> tuple[BakeGraph, dict[str, str]]:
    """The tick's graph, and the Zot-like fake holding each of its tags (their digests)."""
    graph = tick_graph(out_dir, zot.host)
    return graph, fill_registry(
        graph, zot.host, lambda repo, tag: zot.put(repo, tag, pushed_at=PUSHED_AT)
    )


def filled_docker_registry(
    server: RegistryServer, out_dir: Path
) -> tuple[BakeGraph, dict[str, str]]:
    """The tick's graph in a fresh namespace, and the real registry holding each of its tags."""
    graph = tick_graph(out_dir, server.host, server.new_repo("rocm-pytorch"))
    return graph, fill_registry(
        graph, server.host, lambda repo, tag: server.push_image(repo, tag, tag.encode())
    )


def repositories(digests: Mapping[str, str]) -> set[str]:
    """The repositories of `host/repo:tag` references."""
    return {ref.split("/", 1)[1].split(":")[0] for ref in digests}


def fill_registry(graph: BakeGraph, host: str, push: Callable[[str, str], str]) -> dict[str, str]:
    """Put an image on the registry at `host` for every watched tag, with `push(repo, tag)`
    returning its digest; the digest of each tag."""
    digests = {}
    for entry in entries(graph):
        ref = entry.tags[0]
        repo, tag = ref.removeprefix(f"{host}/").split(":")
        digests[ref] = push(repo, tag)
    return digests


def materialize_all(
    instance: dg.DagsterInstance, graph: BakeGraph, digests: Mapping[str, str]
) -> None:
    """A farm where Dagster built every asset partition: each one's last materialization
    carries the digest its tag holds, so every tick evaluates every digest check."""
    for entry in entries(graph):
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                dg.AssetKey(entry.target),
                partition=entry.partition,
                tags={DATA_VERSION_TAG: digests[entry.tags[0]]},
            )
        )


def measure_ticks(
    graph: BakeGraph,
    url: str,
    requests: Callable[[], int],
    digests: Mapping[str, str],
    repeats: int,
) -> dict[str, Any]:
    """`repeats` first ticks (empty cursor), then `repeats` steady ticks with the cursor fed
    back, against a registry holding every watched tag; `requests` counts what it served."""
    first: list[float] = []
    steady: list[float] = []
    first_requests: list[int] = []
    steady_requests: list[int] = []
    with tempfile.TemporaryDirectory() as home, dg.instance_for_test(temp_dir=home) as instance:
        materialize_all(instance, graph, digests)
        ticker = SensorTicker(graph, instance, url)
        for _ in range(repeats):
            before = requests()
            seconds, result = ticker.tick(None)
            first.append(seconds)
            first_requests.append(requests() - before)
        first_events = len(result.asset_events)
        for event in result.asset_events:
            instance.report_runless_asset_event(event)
        cursor = result.cursor
        for _ in range(repeats):
            before = requests()
            seconds, result = ticker.tick(cursor)
            steady.append(seconds)
            steady_requests.append(requests() - before)
            if result.asset_events:
                raise AssertionError(f"a steady tick emitted {len(result.asset_events)} events")
            cursor = result.cursor
    return {
        "first_median_s": round(statistics.median(first), 4),
        "first_max_s": round(max(first), 4),
        "steady_median_s": round(statistics.median(steady), 4),
        "steady_max_s": round(max(steady), 4),
        "first_requests": max(first_requests),
        "steady_requests": max(steady_requests),
        "first_events": first_events,
    }
