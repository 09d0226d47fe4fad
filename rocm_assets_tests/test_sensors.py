"""The registry observation sensor, run tick after tick as the daemon runs it.

Real: Debian's docker-registry (`registry_server`), pushed to and deleted from over the HTTP API
"outside Dagster"; the shipped rocm-bake.hcl with REGISTRY at that registry and a NAMESPACE of the
test's own; a sqlite `instance_for_test`. The daemon's part is done by `Ticker`: it feeds the
cursor back and reports each event with `report_runless_asset_event`, as the sensor daemon does.
The Zot-like fake (real sockets) covers GraphQL request counts, push times and failure modes; a
closed loopback port is the registry that is down.
"""

import dagster as dg
import httpx
import pytest

from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.common.constants import REGISTRY_DIGEST_CHECK
from rocm_assets.defs.registry_checks import DATA_VERSION_TAG
from rocm_assets.defs.resources.registry import RegistryResource
from rocm_assets.defs.sensors import SENSOR_NAME, build_registry_observation_sensor
from rocm_assets_tests.helpers import PROJECT_ROOT, free_port
from rocm_assets_tests.servers.fakes import FakeZot
from rocm_assets_tests.servers.registry import OCI_MANIFEST, RegistryServer

SHIPPED = PROJECT_ROOT / "rocm-bake.hcl"
TORCH_TAG = "2.15.0-10.1.0-full"
PYTORCH = dg.AssetKey("pytorch")

Event = dg.AssetObservation | dg.AssetCheckEvaluation | dg.AssetMaterialization


class Ticker:
    """The sensor daemon's loop, one `tick()` at a time."""

    def __init__(self, graph: BakeGraph, instance: dg.DagsterInstance, url: str) -> None:
        self.sensor = build_registry_observation_sensor(graph)
        self.instance = instance
        self.registry = RegistryResource(url=url, retries=0)
        self.cursor: str | None = None

    def tick(self) -> tuple[list[Event], dg.SensorResult | dg.SkipReason]:
        with dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources={"registry": self.registry}
        ) as context:
            result = self.sensor(context)
        if isinstance(result, dg.SkipReason):
            return [], result
        assert isinstance(result, dg.SensorResult)
        events = list(result.asset_events)
        for event in events:
            self.instance.report_runless_asset_event(event)
        if result.cursor is not None:
            self.cursor = result.cursor
        return events, result


def graph_for(host: str, namespace: str) -> BakeGraph:
    return load_graph(SHIPPED, {"REGISTRY": host, "NAMESPACE": namespace})


def delete_tag(server: RegistryServer, repo: str, tag: str) -> None:
    with httpx.Client(base_url=server.url, trust_env=False) as http:
        head = http.head(f"/v2/{repo}/manifests/{tag}", headers={"Accept": OCI_MANIFEST})
        digest = head.headers["Docker-Content-Digest"]
        http.delete(f"/v2/{repo}/manifests/{digest}").raise_for_status()


def observations(events: list[Event]) -> list[dg.AssetObservation]:
    return [e for e in events if isinstance(e, dg.AssetObservation)]


@pytest.mark.real
def test_a_push_outside_dagster_is_reported_exactly_once(registry_server: RegistryServer) -> None:
    namespace = registry_server.new_repo("rocm-pytorch")
    graph = graph_for(registry_server.host, namespace)
    with dg.instance_for_test() as instance:
        ticker = Ticker(graph, instance, registry_server.url)
        events, result = ticker.tick()
        assert events == [] and result.skip_reason is not None  # an empty registry: quiet

        tag = f"{registry_server.host}/{namespace}/pytorch:{TORCH_TAG}-gfx942"
        digest = registry_server.push_image(f"{namespace}/pytorch", f"{TORCH_TAG}-gfx942")
        triton = f"{registry_server.host}/{namespace}/triton-wheel:3.7.0-rocm10.1.0"
        triton_digest = registry_server.push_image(f"{namespace}/triton-wheel", "3.7.0-rocm10.1.0")
        events, _ = ticker.tick()
        assert sorted(((e.asset_key, e.partition) for e in events), key=str) == [
            (PYTORCH, "gfx942"),
            (dg.AssetKey("triton-wheel"), None),  # noarch: no partition
        ]
        by_key = {e.asset_key: e for e in observations(events)}
        assert by_key[PYTORCH].metadata == {
            "tag": dg.TextMetadataValue(tag),
            "digest": dg.TextMetadataValue(digest),
        }  # docker-registry gives no push time
        assert by_key[PYTORCH].tags == {DATA_VERSION_TAG: digest}
        assert by_key[dg.AssetKey("triton-wheel")].metadata["tag"].value == triton
        assert by_key[dg.AssetKey("triton-wheel")].tags == {DATA_VERSION_TAG: triton_digest}

        for _ in range(2):
            events, result = ticker.tick()
            assert events == [] and result.skip_reason is not None
        stored = instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=PYTORCH, asset_partitions=["gfx942"]), limit=10
        ).records
        assert len(stored) == 1 and stored[0].asset_observation.tags[DATA_VERSION_TAG] == digest

        # Pushed again with new content: the new digest, once.
        moved = registry_server.push_image(f"{namespace}/pytorch", f"{TORCH_TAG}-gfx942", b"v2")
        events, _ = ticker.tick()
        assert [(e.asset_key, e.partition, e.tags) for e in events] == [
            (PYTORCH, "gfx942", {DATA_VERSION_TAG: moved})
        ]
        assert ticker.tick()[0] == []

        # Deleted: one observation says so, then the tag leaves the cursor and all is quiet.
        delete_tag(registry_server, f"{namespace}/pytorch", f"{TORCH_TAG}-gfx942")
        events, _ = ticker.tick()
        assert [(e.asset_key, e.partition) for e in events] == [(PYTORCH, "gfx942")]
        assert events[0].metadata == {
            "tag": dg.TextMetadataValue(tag),
            "absent": dg.BoolMetadataValue(True),
            "last_digest": dg.TextMetadataValue(moved),
        }
        assert DATA_VERSION_TAG not in (events[0].tags or {})
        assert ticker.tick()[0] == []


@pytest.mark.real
def test_a_digest_that_is_not_the_last_materialization_fails_the_check(
    registry_server: RegistryServer,
) -> None:
    namespace = registry_server.new_repo("rocm-pytorch")
    graph = graph_for(registry_server.host, namespace)
    repo, tag = f"{namespace}/pytorch", f"{TORCH_TAG}-gfx942"
    ref = f"{registry_server.host}/{repo}:{tag}"
    with dg.instance_for_test() as instance:
        ticker = Ticker(graph, instance, registry_server.url)
        built = registry_server.push_image(repo, tag, b"built by dagster")
        instance.report_runless_asset_event(
            dg.AssetMaterialization(PYTORCH, partition="gfx942", tags={DATA_VERSION_TAG: built})
        )
        events, _ = ticker.tick()
        checks = [e for e in events if isinstance(e, dg.AssetCheckEvaluation)]
        assert [(c.asset_key, c.check_name, c.passed) for c in checks] == [
            (PYTORCH, REGISTRY_DIGEST_CHECK, True)
        ]

        outside = registry_server.push_image(repo, tag, b"make push-all")
        events, _ = ticker.tick()
        assert len(observations(events)) == 1
        (check,) = [e for e in events if isinstance(e, dg.AssetCheckEvaluation)]
        assert (check.passed, check.severity) == (False, dg.AssetCheckSeverity.WARN)
        assert check.description == (
            f"{ref} is {outside} in the registry but was materialized as {built}: "
            "pushed outside Dagster"
        )
        assert check.metadata == {
            "mismatched": dg.MetadataValue.json(["gfx942"]),
            "digests": dg.MetadataValue.json(
                {"gfx942": {"tag": ref, "registry_digest": outside, "materialized_digest": built}}
            ),
        }
        assert ticker.tick()[0] == []  # reported once, not every tick

        # A new materialization of what is in the registry passes it again.
        instance.report_runless_asset_event(
            dg.AssetMaterialization(PYTORCH, partition="gfx942", tags={DATA_VERSION_TAG: outside})
        )
        events, _ = ticker.tick()
        assert [(type(e), e.passed) for e in events] == [(dg.AssetCheckEvaluation, True)]
        assert events[0].description == f"the materialized tag {ref} holds the image Dagster built"
        history = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(PYTORCH, REGISTRY_DIGEST_CHECK), limit=10
        )
        assert [h.status.value for h in history] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]


def test_requests_per_tick_grow_with_repositories(zot_fake: FakeZot) -> None:
    graph = graph_for(zot_fake.host, "rocm-pytorch")
    repos = set()
    for target in graph.asset_targets:
        for arch in graph.arches:
            repo, tag = graph.tags(target, arch)[0].removeprefix(f"{zot_fake.host}/").split(":")
            zot_fake.put(repo, tag, pushed_at=1_790_000_000.0)
            repos.add(repo)
    images = sum(len(tags) for tags in zot_fake.repos.values())
    assert len(repos) == 15 and images == 13 * 5 + 2  # 13 per-arch assets, 2 noarch
    with dg.instance_for_test() as instance:
        ticker = Ticker(graph, instance, zot_fake.url)
        events, _ = ticker.tick()
        assert len(zot_fake.log) <= len(repos) + 1
        assert len(observations(events)) == images
        pushed = observations(events)[0].metadata["pushed_at"]
        assert pushed == dg.MetadataValue.timestamp(1_790_000_000.0)
        before = len(zot_fake.log)
        assert ticker.tick()[0] == []
        assert len(zot_fake.log) - before <= len(repos) + 1


@pytest.mark.parametrize(
    ("failure", "cause"),
    [
        ("500", "500 Internal Server Error for POST /v2/_zot/ext/search: server error"),
        ("403", "make sure no_proxy covers it"),
        ("401", "the registry needs credentials"),
        ("malformed", "malformed JSON in the reply to POST /v2/_zot/ext/search"),
    ],
)
def test_a_refusing_registry_skips_and_keeps_the_cursor(
    zot_fake: FakeZot, failure: str, cause: str
) -> None:
    graph = graph_for(zot_fake.host, "rocm-pytorch")
    zot_fake.put("rocm-pytorch/pytorch", f"{TORCH_TAG}-gfx942")
    with dg.instance_for_test() as instance:
        ticker = Ticker(graph, instance, zot_fake.url)
        assert len(ticker.tick()[0]) == 1
        cursor = ticker.cursor
        zot_fake.fail = failure
        events, result = ticker.tick()
        assert events == [] and isinstance(result, dg.SkipReason)
        assert result.skip_message.startswith(
            f"registry not read, nothing changed: registry {zot_fake.url}: "
        )
        assert cause in result.skip_message and "\n" not in result.skip_message
        assert ticker.cursor == cursor
        # Back up: nothing was marked absent, so nothing is reported again.
        zot_fake.fail = None
        assert ticker.tick()[0] == []


def test_a_registry_that_is_down_skips_and_keeps_the_cursor() -> None:
    port = free_port()  # nothing listens there
    graph = graph_for(f"127.0.0.1:{port}", "rocm-pytorch")
    with dg.instance_for_test() as instance:
        ticker = Ticker(graph, instance, f"http://127.0.0.1:{port}")
        ticker.cursor = '{"checks": {}, "seen": {"pytorch@gfx942": "sha256:' + "a" * 64 + '"}}'
        cursor = ticker.cursor
        events, result = ticker.tick()
        assert events == [] and isinstance(result, dg.SkipReason)
        assert result.skip_message.startswith(
            f"registry not read, nothing changed: registry http://127.0.0.1:{port}: cannot "
            f"connect for POST /v2/_zot/ext/search after 1 attempt"
        )
        assert ticker.cursor == cursor


def test_a_registry_other_than_the_graphs_is_named(zot_fake: FakeZot) -> None:
    with dg.instance_for_test() as instance:
        ticker = Ticker(load_graph(SHIPPED, {}), instance, zot_fake.url)
        events, result = ticker.tick()
    assert events == [] and isinstance(result, dg.SkipReason)
    assert result.skip_message == (
        f"no asset's tag is on the registry {zot_fake.url} (e.g. "
        "zot.snoc.lan:5000/rocm-pytorch/rocm-runtime:10.1.0-full-gfx942): REGISTRY must name "
        "the registry ROCM_REGISTRY_URL points at"
    )
    assert zot_fake.log == []


def test_the_code_location_registers_sensor_and_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(PROJECT_ROOT)
    monkeypatch.delenv("ROCM_BAKE_FILE", raising=False)
    from rocm_assets.definitions import defs

    loaded = defs()
    sensor = loaded.resolve_sensor_def(SENSOR_NAME)
    assert sensor.minimum_interval_seconds == 60
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert sensor.required_resource_keys == {"registry"}
    asset_graph = loaded.resolve_asset_graph()
    assets = asset_graph.get_all_asset_keys()
    registry_checks = {k for k in asset_graph.asset_check_keys if k.name == REGISTRY_DIGEST_CHECK}
    assert registry_checks == {dg.AssetCheckKey(key, REGISTRY_DIGEST_CHECK) for key in assets}


# ##### The reason every tick shows in the UI (the sensor starts no runs: each tick is "skipped")


def reason(result: dg.SensorResult | dg.SkipReason) -> str:
    skip = result if isinstance(result, dg.SkipReason) else result.skip_reason
    assert skip is not None and skip.skip_message and "\n" not in skip.skip_message
    return skip.skip_message


def test_an_unset_registry_url_is_the_reason() -> None:
    with dg.instance_for_test() as instance:
        sensor = build_registry_observation_sensor(load_graph(SHIPPED, {}))
        with dg.build_sensor_context(
            instance=instance, resources={"registry": RegistryResource()}
        ) as context:
            result = sensor(context)
    assert isinstance(result, dg.SkipReason)
    assert reason(result) == (
        "registry not read, nothing changed: ROCM_REGISTRY_URL is not set: point it at the "
        "registry bake pushes to (the REGISTRY host), e.g. https://zot.example:5000"
    )


def test_a_tick_that_observes_says_what_it_observed(zot_fake: FakeZot) -> None:
    graph = graph_for(zot_fake.host, "rocm-pytorch")
    repos = len(graph.asset_targets)  # one repository per asset target, one request each
    zot_fake.put("rocm-pytorch/pytorch", f"{TORCH_TAG}-gfx942")
    zot_fake.put("rocm-pytorch/triton-wheel", "3.7.0-rocm10.1.0")
    with dg.instance_for_test() as instance:
        ticker = Ticker(graph, instance, zot_fake.url)
        events, result = ticker.tick()
        assert len(events) == 2
        assert reason(result) == (
            f"observed 2 new or moved tags and 0 gone, 0 digest check results, from "
            f"{zot_fake.url} in {repos} requests; no runs to start"
        )
        assert reason(ticker.tick()[1]) == (
            f"no change in {zot_fake.url}: 2 tags present, {repos} requests"
        )
        del zot_fake.repos["rocm-pytorch/pytorch"][f"{TORCH_TAG}-gfx942"]
        assert reason(ticker.tick()[1]) == (
            f"observed 0 new or moved tags and 1 gone, 0 digest check results, from "
            f"{zot_fake.url} in {repos} requests; no runs to start"
        )


def test_a_bake_file_with_no_tags_says_there_is_nothing_to_observe(
    tmp_path, zot_fake: FakeZot
) -> None:
    bake = tmp_path / "bake.hcl"
    bake.write_text('GPU_ARCHES = ["gfx942"]\ntarget "untagged" {\n  dockerfile = "x"\n}\n')
    with dg.instance_for_test() as instance:
        _, result = Ticker(load_graph(bake, {}), instance, zot_fake.url).tick()
    assert isinstance(result, dg.SkipReason)
    assert reason(result) == "no asset target has a tag in the bake file: nothing to observe"
    assert zot_fake.log == []
