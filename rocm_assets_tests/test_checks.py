"""Test targets as GPU asset checks: pass, fail, timeout, skip, and the jobs around them.

Real parts: Debian's OpenSSH sshd from the `sshd_server` fixture (rocm_assets_tests/servers/sshd.py)
with host-key checking and key login, the check's `docker run` command line crossing a real SSH
channel and shell, Dagster's execution of the check job on a real (temporary) instance, and the
status the UI shows, resolved by Dagster's own `AssetCheckExecutionRecord.resolve_status`.
Canned: each node's `docker`, which echoes its arguments and exits 0 (node "big"), 1 ("small") or
never ("stuck"); the fleet file, written per test, which says which node has which GPU; and bake,
which no package ships: the recording docker shim stands in for the test image's bake.
"""

import asyncio
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.loader import LoadingContextForTest
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecord,
    AssetCheckExecutionResolvedStatus,
)

from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.fleet import Node
from rocm_assets.core.probes import NodeCommandError, OutputTail, run_on_node
from rocm_assets.defs.assets import build_bake_assets, build_jobs
from rocm_assets.defs.checks import (
    GpuTestResource,
    build_gpu_test_checks,
    build_gpu_test_jobs,
    docker_run_argv,
    gpu_test_check_key,
)
from rocm_assets.defs.resources.bake import BakeResource
from rocm_assets.defs.resources.registry import RegistryResource
from rocm_assets_tests.helpers import PROJECT_ROOT, free_port, write_fleet
from rocm_assets_tests.servers.sshd import SshdServer

SHIPPED = PROJECT_ROOT / "rocm-bake.hcl"
PARTITION_TAG = "dagster/partition"


@pytest.fixture(scope="module")
def graph() -> BakeGraph:
    return load_graph(SHIPPED, {})


@pytest.fixture(autouse=True)
def recorded_bake(docker_shim_record, monkeypatch: pytest.MonkeyPatch):
    """Every check bakes its test image first; the recording shim stands in for buildx."""
    for name, value in docker_shim_record.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(
        "ROCM_SHIM_BUILDERS", "gpu-ok,gpu-bad,gpu-stuck,gpu-gone,gpu-ok-2,builder-only"
    )
    return docker_shim_record


@pytest.fixture
def gpu_fleet(tmp_path: Path, sshd_server: SshdServer) -> Path:
    """gfx942 on "big" (docker exits 0), gfx950 on "small" (exits 1), gfx1100 on "stuck" (hangs),
    gfx1201 on a dead port first and "big" second, and gfx1250 nowhere."""
    return write_fleet(
        tmp_path / "fleet.yaml",
        [
            {"name": "gpu-ok", "ssh": sshd_server.ssh_address("big"), "gpus": ["gfx942"]},
            {"name": "gpu-bad", "ssh": sshd_server.ssh_address("small"), "gpus": ["gfx950"]},
            {"name": "gpu-stuck", "ssh": sshd_server.ssh_address("stuck"), "gpus": ["gfx1100"]},
            {"name": "gpu-gone", "ssh": f"root@127.0.0.1:{free_port()}", "gpus": ["gfx1201"]},
            {"name": "gpu-ok-2", "ssh": sshd_server.ssh_address("big"), "gpus": ["gfx1201"]},
            {"name": "builder-only", "ssh": sshd_server.ssh_address("big")},
        ],
        cores=8,
        mem_gb=16,
        link_mbps=100,
    )


def _resource(sshd: SshdServer, fleet: Path, **overrides: Any) -> GpuTestResource:
    return GpuTestResource(
        fleet_file=str(fleet),
        known_hosts=str(sshd.known_hosts),
        key_filename=str(sshd.client_key),
        connect_timeout_s=15.0,
        **overrides,
    )


def _defs(graph: BakeGraph, gpu_test: GpuTestResource) -> dg.Definitions:
    return dg.Definitions(
        assets=build_bake_assets(graph),
        asset_checks=build_gpu_test_checks(graph),
        jobs=[*build_jobs(graph), *build_gpu_test_jobs(graph)],
        resources={
            "bake": BakeResource(),
            "registry": RegistryResource(url="http://127.0.0.1:9"),
            "gpu_test": gpu_test,
        },
    )


def _run_check(
    graph: BakeGraph, gpu_test: GpuTestResource, instance: dg.DagsterInstance, arch: str | None
) -> dg.ExecuteInProcessResult:
    job = _defs(graph, gpu_test).resolve_job_def("pytorch_test_job")
    tags = {PARTITION_TAG: arch} if arch else {}
    return job.execute_in_process(instance=instance, tags=tags, raise_on_error=False)


def _ui_status(
    instance: dg.DagsterInstance, key: dg.AssetCheckKey, arch: str
) -> AssetCheckExecutionResolvedStatus:
    """The check's status for one arch, resolved the way the webserver resolves it."""
    records = instance.event_log_storage.get_asset_check_execution_history(
        key, limit=1, partition_filter=PartitionKeyFilter(key=arch)
    )
    assert len(records) == 1
    record: AssetCheckExecutionRecord = records[0]
    return asyncio.run(record.resolve_status(LoadingContextForTest(instance)))


def _evaluation(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    evaluations = result.get_asset_check_evaluations()
    assert len(evaluations) == 1
    return evaluations[0]


# ##### THE CHECK, AGAINST THE REAL SSHD


@pytest.mark.real
def test_check_passes_with_the_log_tail(graph, sshd_server, gpu_fleet, recorded_bake) -> None:
    with dg.instance_for_test() as instance:
        result = _run_check(graph, _resource(sshd_server, gpu_fleet), instance, "gfx942")
        assert result.success
        evaluation = _evaluation(result)
        key = gpu_test_check_key(graph, "pytorch-test")
        assert evaluation.asset_check_key == key
        assert evaluation.passed
        assert evaluation.partition == "gfx942"
        meta = evaluation.metadata
        # the test image was baked for this arch on the GPU node's builder, and exactly the
        # digest bake pushed is what ran
        (bake,) = recorded_bake.records()
        assert bake["argv"][-1] == "pytorch-test" and bake["env"]["GPU_ARCH"] == "gfx942"
        assert bake["argv"][bake["argv"].index("--builder") + 1] == "gpu-ok"
        digest = bake["metadata"]["pytorch-test"]["containerimage.digest"]
        image = f"{graph.tags('pytorch-test', 'gfx942')[0]}@{digest}"
        assert meta["node"].value == "gpu-ok"
        assert meta["image"].value == image
        assert meta["exit_code"].value == 0
        tail = meta["log_tail"].value
        # Each argument arrived whole through sshd's shell: shlex.join quoted the command line.
        for arg in ("--rm", "--pull=always", "/dev/kfd", "/dev/dri", "video", image):
            assert f"arg: {arg}\n" in tail
        # stderr is in the same tail as stdout.
        assert "big: test log, exit 0" in tail
        assert _ui_status(instance, key, "gfx942") == AssetCheckExecutionResolvedStatus.SUCCEEDED


@pytest.mark.real
def test_check_fails_when_the_test_exits_nonzero(graph, sshd_server, gpu_fleet) -> None:
    with dg.instance_for_test() as instance:
        result = _run_check(graph, _resource(sshd_server, gpu_fleet), instance, "gfx950")
        # A failed test is a check result, not a failed run.
        assert result.success
        evaluation = _evaluation(result)
        assert not evaluation.passed
        assert evaluation.severity == dg.AssetCheckSeverity.ERROR
        assert evaluation.metadata["node"].value == "gpu-bad"
        assert evaluation.metadata["exit_code"].value == 1
        assert "small: test log, exit 1" in evaluation.metadata["log_tail"].value
        assert evaluation.description.endswith("(gfx950): exited 1")
        key = gpu_test_check_key(graph, "pytorch-test")
        assert _ui_status(instance, key, "gfx950") == AssetCheckExecutionResolvedStatus.FAILED


@pytest.mark.real
def test_check_fails_when_the_test_outlives_its_bound(graph, sshd_server, gpu_fleet) -> None:
    gpu_test = _resource(sshd_server, gpu_fleet, test_timeout_s=1.0, cleanup_timeout_s=1.0)
    with dg.instance_for_test() as instance:
        result = _run_check(graph, gpu_test, instance, "gfx1100")
        assert result.success
        evaluation = _evaluation(result)
        assert not evaluation.passed
        assert evaluation.metadata["exit_code"].value == "timeout"
        assert evaluation.description.endswith(
            "timed out after 1 s; the container was NOT removed (see the run log)"
        )
        # The container is removed by name after the timeout; on this node that hangs too.
        warnings = [r.user_message for r in instance.all_logs(result.run_id) if r.level >= 30]
        removal = [w for w in warnings if "`docker rm -f rocm-test-" in w]
        assert len(removal) == 1
        assert "-gfx1100` on gpu-stuck ended in a timeout" in removal[0]


@pytest.mark.real
def test_check_tries_the_next_node_with_the_gpu(graph, sshd_server, gpu_fleet) -> None:
    with dg.instance_for_test() as instance:
        result = _run_check(graph, _resource(sshd_server, gpu_fleet), instance, "gfx1201")
        evaluation = _evaluation(result)
        assert evaluation.passed
        assert evaluation.metadata["node"].value == "gpu-ok-2"
        warnings = [r.user_message for r in instance.all_logs(result.run_id) if r.level >= 30]
        assert any("gpu-gone: ssh connection to root@127.0.0.1" in w for w in warnings)


@pytest.mark.real
def test_check_is_skipped_where_no_node_has_the_gpu(graph, sshd_server, gpu_fleet) -> None:
    with dg.instance_for_test() as instance:
        result = _run_check(graph, _resource(sshd_server, gpu_fleet), instance, "gfx1250")
        assert result.success
        assert result.get_asset_check_evaluations() == []
        warnings = [r.user_message for r in instance.all_logs(result.run_id) if r.level >= 30]
        assert "pytorch_test skipped: no node in the fleet has a gfx1250 GPU" in warnings[0]
        key = gpu_test_check_key(graph, "pytorch-test")
        assert _ui_status(instance, key, "gfx1250") == AssetCheckExecutionResolvedStatus.SKIPPED


def test_check_is_skipped_where_the_gpu_node_has_no_ssh(graph, tmp_path) -> None:
    fleet = write_fleet(
        tmp_path / "fleet.yaml",
        [{"name": "desk", "gpus": ["gfx1250"]}],
        cores=8,
        mem_gb=16,
        link_mbps=100,
    )
    with dg.instance_for_test() as instance:
        result = _run_check(graph, GpuTestResource(fleet_file=str(fleet)), instance, "gfx1250")
        assert result.success
        assert result.get_asset_check_evaluations() == []
        warnings = [r.user_message for r in instance.all_logs(result.run_id) if r.level >= 30]
        assert "gfx1250 is only on desk, which has no ssh address" in warnings[0]


@pytest.mark.real
def test_unknown_host_key_is_refused_not_passed(graph, sshd_server, gpu_fleet, monkeypatch) -> None:
    monkeypatch.delenv("ROCM_SSH_KNOWN_HOSTS", raising=False)
    gpu_test = GpuTestResource(
        fleet_file=str(gpu_fleet), key_filename=str(sshd_server.client_key), connect_timeout_s=15.0
    )
    with dg.instance_for_test() as instance:
        result = _run_check(graph, gpu_test, instance, "gfx942")
        assert not result.success
        assert result.get_asset_check_evaluations() == []
        failure = result.failure_data_for_node("pytorch_test")
        assert failure is not None
        assert "no gfx942 node could run" in failure.error.message
        assert "not in known_hosts" in failure.error.message
        key = gpu_test_check_key(graph, "pytorch-test")
        status = _ui_status(instance, key, "gfx942")
        assert status == AssetCheckExecutionResolvedStatus.EXECUTION_FAILED


@pytest.mark.real
def test_check_launched_alone_from_the_asset_page_runs(graph, sshd_server, gpu_fleet) -> None:
    # The UI's "Execute" on a check runs the implicit asset job subset to that check alone.
    defs = _defs(graph, _resource(sshd_server, gpu_fleet))
    key = gpu_test_check_key(graph, "pytorch-test")
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection=set(), asset_check_selection={key}
    )
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, tags={PARTITION_TAG: "gfx942"})
        assert _evaluation(result).passed


def test_a_missing_fleet_file_is_one_line(graph, tmp_path) -> None:
    missing = tmp_path / "nope.yaml"
    with dg.instance_for_test() as instance:
        result = _run_check(graph, GpuTestResource(fleet_file=str(missing)), instance, "gfx942")
        failure = result.failure_data_for_node("pytorch_test")
        assert failure is not None
        assert failure.error.message.strip().endswith(
            f"{missing}: cannot read fleet file: No such file or directory "
            "(set ROCM_FLEET_FILE or pass a path)"
        )


def test_check_without_an_arch_says_how_to_give_one(graph, tmp_path) -> None:
    fleet = write_fleet(
        tmp_path / "fleet.yaml", [{"name": "desk"}], cores=8, mem_gb=16, link_mbps=100
    )
    with dg.instance_for_test() as instance:
        result = _run_check(graph, GpuTestResource(fleet_file=str(fleet)), instance, None)
        assert not result.success
        failure = result.failure_data_for_node("pytorch_test")
        assert failure is not None
        assert "launch it with the run tag dagster/partition=<arch>" in failure.error.message


# ##### run_on_node, the fleet's SSH command runner


@pytest.mark.real
def test_run_on_node_passes_each_argument_whole(sshd_server) -> None:
    node = Node(
        name="n", builder="b", ssh=sshd_server.ssh_address("small"), cores=1, mem_gb=1, link_mbps=1
    )
    argv = ["docker", "run", "a b", "$(touch /tmp/never)", "it's"]
    result = run_on_node(
        node,
        argv,
        timeout_s=10,
        connect_kwargs=sshd_server.connect_kwargs(),
        known_hosts=sshd_server.known_hosts,
    )
    assert result.exit_code == 1
    assert not result.timed_out
    # No argument was split or expanded by the remote shell; stderr joins the same tail (its
    # place among the stdout lines is arrival order, which two SSH streams do not fix).
    stdout = [line for line in result.tail if line.startswith("arg: ")]
    assert stdout == ["arg: a b", "arg: $(touch /tmp/never)", "arg: it's"]
    assert "small: test log, exit 1" in result.tail


def test_output_tail_keeps_the_last_lines_of_each_stream_whole() -> None:
    tail = OutputTail(3)
    out, err = tail.stream(), tail.stream()
    out.write("one\ntw")
    err.write("E1\n")
    out.write("o\nthree\nfo")
    # "tw" + "o" is one stdout line even though a stderr line arrived in between.
    assert tail.lines() == ("two", "three", "fo")
    err.write("E2")
    assert tail.lines() == ("three", "fo", "E2")


def test_run_on_node_refuses_a_node_without_ssh() -> None:
    node = Node(name="desk", builder="b", cores=1, mem_gb=1, link_mbps=1)
    with pytest.raises(NodeCommandError, match="node desk has no ssh address"):
        run_on_node(node, ["true"], timeout_s=1)


def test_docker_run_argv_gives_the_container_the_gpu() -> None:
    argv = docker_run_argv("docker", "reg/ns/pytorch-test:tag", "rocm-test-1")
    assert argv[:2] == ["docker", "run"] and argv[-1] == "reg/ns/pytorch-test:tag"
    assert {"--device", "/dev/kfd", "/dev/dri", "--group-add", "video", "--rm"} <= set(argv)


# ##### JOBS: the test job, and pytorch-run's own


def test_each_test_target_has_a_job_running_only_its_check(graph) -> None:
    job = _defs(graph, GpuTestResource()).resolve_job_def("pytorch_test_job")
    assert job.asset_layer.executable_asset_keys == set()
    assert set(job.asset_layer.asset_graph.asset_check_keys) == {
        gpu_test_check_key(graph, "pytorch-test")
    }


class _DigestBake(BakeResource):
    """Returns a digest instead of baking."""

    def materialize(self, context: dg.AssetExecutionContext, target: str, *_: Any) -> Any:
        return dg.MaterializeResult(data_version=dg.DataVersion(f"sha256:{target}"))


@pytest.mark.real
def test_a_build_run_skips_the_test(graph, sshd_server, gpu_fleet) -> None:
    # The default group job selects pytorch's checks too; its run builds, and tests nothing.
    defs = _defs(graph, _resource(sshd_server, gpu_fleet))
    job = defs.resolve_job_def("default")
    key = gpu_test_check_key(graph, "pytorch-test")
    assert key in set(job.asset_layer.asset_graph.asset_check_keys)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            build_bake_assets(graph) + build_gpu_test_checks(graph),
            selection=dg.AssetSelection.assets(dg.AssetKey("pytorch"))
            | dg.AssetSelection.checks(key),
            partition_key="gfx942",
            instance=instance,
            resources={
                "bake": _DigestBake(),
                "registry": RegistryResource(url="http://127.0.0.1:9"),
                "gpu_test": _resource(sshd_server, gpu_fleet),
            },
        )
        assert result.success
        assert result.get_asset_check_evaluations() == []
        warnings = [r.user_message for r in instance.all_logs(result.run_id) if r.level >= 30]
        assert "pytorch_test skipped: this run builds pytorch; run pytorch_test_job" in warnings[0]
        assert _ui_status(instance, key, "gfx942") == AssetCheckExecutionResolvedStatus.SKIPPED


def test_pytorch_run_is_built_by_its_own_job_only(graph) -> None:
    defs = _defs(graph, GpuTestResource())
    own = defs.resolve_job_def("pytorch_run_job")
    assert own.asset_layer.executable_asset_keys == {dg.AssetKey("pytorch-run")}
    for group in graph.groups:
        keys = defs.resolve_job_def(group).asset_layer.executable_asset_keys
        assert dg.AssetKey("pytorch-run") not in keys, group


def test_test_targets_come_from_the_bake_file(tmp_path) -> None:
    text = SHIPPED.read_text().replace(
        'TEST_TARGETS = ["pytorch-test"]', 'TEST_TARGETS = ["pytorch-test", "vllm-test"]'
    )
    text += """
target "vllm-test" {
  inherits = ["_common"]
  contexts = USE_PUB ? {} : { "vllm" = "target:vllm" }
  args = { VLLM_IMAGE = USE_PUB ? PUB_VLLM : "vllm" }
  tags = [img("vllm-test", TORCH_TAG)]
}
"""
    path = tmp_path / "bake.hcl"
    path.write_text(text)
    graph = load_graph(path, {})
    defs = _defs(graph, GpuTestResource())
    job = defs.resolve_job_def("vllm_test_job")
    assert set(job.asset_layer.asset_graph.asset_check_keys) == {
        dg.AssetCheckKey(dg.AssetKey("vllm"), "vllm_test")
    }
    assert dg.AssetKey("vllm-test") not in defs.resolve_asset_graph().get_all_asset_keys()
