"""The asset factory and the code location: keys, deps, partitions, kinds, jobs.

Real parts: the shipped rocm-bake.hcl and Dagster's own definition loading. No builds run here.
"""

from pathlib import Path

import dagster as dg
import pytest

from rocm_assets.core.bake import load_graph
from rocm_assets.defs.assets import build_asset_specs, build_bake_assets, build_jobs
from rocm_assets.defs.resources.bake import BakeResource
from rocm_assets.defs.resources.registry import RegistryResource
from rocm_assets_tests.helpers import PROJECT_ROOT, with_target

SHIPPED = PROJECT_ROOT / "rocm-bake.hcl"


@pytest.fixture(scope="module")
def graph():
    return load_graph(SHIPPED, {})


@pytest.fixture(scope="module")
def defs(graph) -> dg.Definitions:
    return dg.Definitions(
        assets=build_bake_assets(graph),
        jobs=build_jobs(graph),
        resources={"bake": BakeResource(), "registry": RegistryResource()},
    )


def test_one_asset_per_target_but_the_test_target(graph, defs) -> None:
    keys = defs.resolve_asset_graph().get_all_asset_keys()
    assert keys == {dg.AssetKey(t) for t in graph.targets if t != "pytorch-test"}
    assert len(keys) == 15
    # hyphenated names stay one key part, never split into ["vllm", "wheel"]
    assert dg.AssetKey("vllm-wheel") in keys and dg.AssetKey(["vllm", "wheel"]) not in keys


def test_deps_and_partition_mappings(graph, defs) -> None:
    asset_graph = defs.resolve_asset_graph()
    for target in graph.asset_targets:
        node = asset_graph.get(dg.AssetKey(target))
        assert {k.to_user_string() for k in node.parent_keys} == set(graph.deps[target])
    specs = {s.key.to_user_string(): s for s in build_asset_specs(graph)}
    mappings = {
        d.asset_key.to_user_string(): d.partition_mapping for d in specs["triton-wheel"].deps
    }
    assert mappings["pytorch-base"] == dg.SpecificPartitionsPartitionMapping(["gfx942"])
    pytorch = {d.asset_key.to_user_string(): d.partition_mapping for d in specs["pytorch"].deps}
    assert isinstance(pytorch["pytorch-base"], dg.IdentityPartitionMapping)
    assert isinstance(pytorch["pytorch-src"], dg.AllPartitionMapping)


def test_partitions_come_from_the_bake_file(graph) -> None:
    specs = {s.key.to_user_string(): s for s in build_asset_specs(graph)}
    assert specs["pytorch-src"].partitions_def is None
    assert specs["triton-wheel"].partitions_def is None
    keys = specs["vllm-wheel"].partitions_def.get_partition_keys()
    assert keys == list(graph.arches) == ["gfx942", "gfx950", "gfx1100", "gfx1201", "gfx1250"]


def test_kinds_tags_and_description(graph) -> None:
    specs = {s.key.to_user_string(): s for s in build_asset_specs(graph)}
    assert specs["vllm-wheel"].kinds == {"docker", "wheel"}
    assert specs["vllm"].kinds == {"docker"}
    assert "rocm-group/serving" in specs["vllm"].tags
    assert "docker/vllm.Dockerfile" in specs["vllm"].description


def test_jobs_mirror_the_groups(graph, defs) -> None:
    names = {job.name for job in defs.resolve_all_job_defs()} - {"__ASSET_JOB"}
    assert names == {"default", "wheels", "serving", "pytorch_run_job"}
    serving = defs.resolve_job_def("serving")
    assert {k.to_user_string() for k in serving.asset_layer.executable_asset_keys} == set(
        graph.groups["serving"]
    )


def test_appended_target_becomes_an_asset(tmp_path: Path) -> None:
    path = with_target(
        tmp_path / "bake.hcl",
        """
target "extra-wheel" {
  inherits = ["_common"]
  contexts = USE_PUB ? {} : { "vllm" = "target:vllm" }
  args = { VLLM_IMAGE = USE_PUB ? PUB_VLLM : "vllm" }
  tags = [img("extra-wheel", TORCH_TAG)]
}
""",
    )
    graph = load_graph(path, {})
    loaded = dg.Definitions(
        assets=build_bake_assets(graph),
        resources={"bake": BakeResource(), "registry": RegistryResource()},
    )
    asset_graph = loaded.resolve_asset_graph()
    node = asset_graph.get(dg.AssetKey("extra-wheel"))
    assert node.parent_keys == {dg.AssetKey("vllm")}
    assert node.partitions_def.get_partition_keys() == list(graph.arches)


def test_code_location_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(PROJECT_ROOT)
    monkeypatch.delenv("ROCM_BAKE_FILE", raising=False)
    from rocm_assets.definitions import defs

    loaded = defs()
    assert len(loaded.resolve_asset_graph().get_all_asset_keys()) == 15
    assert loaded.resolve_job_def("default") is not None
