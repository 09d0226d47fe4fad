"""Test targets as GPU asset checks: pass, fail, timeout, skip, and the jobs around them.

Real parts: the test image's build, which the check makes before it runs anything: Debian's
`docker buildx bake` (buildx 0.29) of the test target on the builder of the first node with the
GPU (a docker context of a Debian dockerd 26; node "gpu-ok" has an engine of its own, so its
history alone says where it built), from the tested image published in Debian's docker-registry,
pushed there, and read back from BuildKit's history and the registry. Also real: Debian's
OpenSSH sshd from the `sshd_server` fixture (rocm_assets_tests/servers/sshd.py) with host-key
checking and key login, the check's `docker run` command line crossing a real SSH channel and
shell, Dagster's execution of the check job on a real (temporary) instance, and the status the
UI shows, resolved by Dagster's own `AssetCheckExecutionRecord.resolve_status`.

The bake file of the checks is the e2e farm (rocm_assets_tests/fixtures/e2e: FROM scratch plus
Debian's static busybox) with the shipped file's arches and one test target, base-test, in
TEST_TARGETS: the check on base, as pytorch-test is the check on pytorch in rocm-bake.hcl. The
tests of the definitions alone (jobs, which targets are tests) read the shipped rocm-bake.hcl.

Canned: each node's `docker` behind sshd, which echoes its arguments and exits 0 (node "big"),
1 ("small") or never ("stuck"), since no node here has a GPU; the fleet file, written per test,
which says which node has which GPU; and, in the one test of a build run that skips the check,
the bake resource, which returns a digest instead of building.
"""

import asyncio
import subprocess
from dataclasses import dataclass
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
from rocm_assets.core.build.invocation import HistoryRecord, build_name, builder_env
from rocm_assets.core.common.names import job_name
from rocm_assets.core.nodes.fleet import Node
from rocm_assets.core.nodes.probes import NodeCommandError, OutputTail, run_on_node
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
from rocm_assets_tests.servers.dockerd import Builders, EnginePool, copy_e2e, make_builders
from rocm_assets_tests.servers.registry import RegistryServer
from rocm_assets_tests.servers.sshd import SshdServer

SHIPPED = PROJECT_ROOT / "rocm-bake.hcl"
PARTITION_TAG = "dagster/partition"
ARCHES = ("gfx942", "gfx950", "gfx1100", "gfx1201", "gfx1250")
# gfx1250 is on no node: its check never builds.
TESTED_ARCHES = ARCHES[:4]
TEST_TARGET = "base-test"
TESTED = "base"
TEST_HCL = f"""
TEST_TARGETS = ["{TEST_TARGET}"]

# The GPU test image: the image it tests, plus the test (test.Dockerfile).
target "{TEST_TARGET}" {{
  context    = "."
  dockerfile = "test.Dockerfile"
  tags       = ["${{REGISTRY}}/e2e/{TEST_TARGET}:${{GPU_ARCH}}"]
  contexts = USE_PUB ? {{}} : {{
    tested = "target:{TESTED}"
  }}
  args = {{
    TESTED_IMAGE = USE_PUB ? PUB_BASE : "tested"
    RUN_ID       = RUN_ID
    MAX_JOBS     = MAX_JOBS
  }}
}}
"""
TEST_DOCKERFILE = """ARG TESTED_IMAGE
FROM ${TESTED_IMAGE}
ARG RUN_ID
LABEL org.rocm.e2e.run-id="${RUN_ID}"
COPY base.txt /e2e/test.txt
"""
# The fleet's nodes, each a builder; "publisher" publishes the tested images.
GPU_BUILDERS = ("gpu-ok", "gpu-bad", "gpu-stuck", "gpu-gone", "gpu-ok-2", "builder-only")
PUBLISHER = "publisher"
BAKE = ("docker", "buildx", "bake", "--progress=plain")
# Guards against a hung bake, not timings.
HANG_GUARD_S = 300.0


@dataclass(frozen=True)
class Farm:
    """The checks' bake file as a graph, its builders, the registry and the bake environment."""

    graph: BakeGraph
    builders: Builders
    registry: RegistryServer
    env: dict[str, str]


@pytest.fixture(scope="module")
def farm(
    tmp_path_factory: pytest.TempPathFactory, engines: EnginePool, registry_server: RegistryServer
) -> Farm:
    root = tmp_path_factory.mktemp("gpu-farm")
    bake_file = copy_e2e(root / "farm", arches=ARCHES, extra=TEST_HCL)
    (bake_file.parent / "test.Dockerfile").write_text(TEST_DOCKERFILE)
    # gpu-ok alone on a second engine: only its history can hold what it built.
    builders = make_builders(
        root / "docker-config",
        {name: engines.get(1 if name == "gpu-ok" else 0) for name in (*GPU_BUILDERS, PUBLISHER)},
    )
    env = {
        k: v
        for k, v in builders.env.items()
        if not k.startswith("ROCM_") and k not in ("PUBLISHED_INPUTS", "GPU_ARCH", "RUN_ID")
    }
    env["REGISTRY"] = f"{registry_server.host}/{registry_server.new_repo('gpu-test')}"
    # The tested image for every arch a node has, published as a build run would push it
    # (one bake per arch, all at once).
    bakes = [
        subprocess.Popen(
            [*BAKE, "-f", str(bake_file), "--builder", PUBLISHER, "--push", "--", TESTED],
            env={**builder_env(PUBLISHER, env), "GPU_ARCH": arch},
            cwd=bake_file.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for arch in TESTED_ARCHES
    ]
    for bake in bakes:
        output, _ = bake.communicate(timeout=HANG_GUARD_S)
        assert bake.returncode == 0, output[-3000:]
    return Farm(load_graph(bake_file, env), builders, registry_server, env)


@pytest.fixture(scope="module")
def graph() -> BakeGraph:
    """The shipped bake file, for what needs no build."""
    return load_graph(SHIPPED, {})


@pytest.fixture
def bake_env(farm: Farm, monkeypatch: pytest.MonkeyPatch) -> Farm:
    """The check's bake runs in this process: it reaches the builders and the test's registry."""
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in farm.env.items():
        monkeypatch.setenv(name, value)
    return farm


def built_test_image(farm: Farm, builder: str, name: str) -> HistoryRecord:
    """The check's one bake of the test image, as the builder's BuildKit history records it."""
    [record] = farm.builders.history(builder, name)
    assert record.status == "Completed"
    return record


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
    # The graph's one test target's job (pytorch_test_job in the shipped file).
    [test_target] = graph.test_targets
    job = _defs(graph, gpu_test).resolve_job_def(f"{job_name(test_target)}_job")
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
def test_check_bakes_the_test_image_on_the_gpu_node_and_runs_that_digest(
    bake_env: Farm, sshd_server: SshdServer, gpu_fleet: Path
) -> None:
    farm, graph = bake_env, bake_env.graph
    with dg.instance_for_test() as instance:
        result = _run_check(graph, _resource(sshd_server, gpu_fleet), instance, "gfx942")
        assert result.success
        evaluation = _evaluation(result)
        key = gpu_test_check_key(graph, TEST_TARGET)
        assert evaluation.asset_check_key == key
        assert evaluation.passed
        assert evaluation.partition == "gfx942"
        assert _ui_status(instance, key, "gfx942") == AssetCheckExecutionResolvedStatus.SUCCEEDED
    meta = evaluation.metadata
    # The test image was baked for this arch on the GPU node's own engine, from the tested
    # image in the registry: nothing of that build is in any other engine's history.
    name = build_name(TEST_TARGET, "gfx942", result.run_id)
    record = built_test_image(farm, "gpu-ok", name)
    assert farm.builders.history(PUBLISHER, name) == []
    inspected = farm.builders.inspect("gpu-ok", record.ref)
    assert not inspected.get("NamedContexts")
    assert {"Name": "TESTED_IMAGE", "Value": graph.tags(TESTED, "gfx942")[0]} in (
        inspected["BuildArgs"]
    )
    # What ran is exactly the digest that bake pushed for the test tag.
    tag = graph.tags(TEST_TARGET, "gfx942")[0]
    digest = farm.registry.digest(tag)
    labels = farm.registry.image_config(tag)["config"]["Labels"]
    assert labels["org.rocm.e2e.run-id"] == result.run_id
    image = f"{tag}@{digest}"
    assert meta["node"].value == "gpu-ok"
    assert meta["image"].value == image
    assert meta["exit_code"].value == 0
    tail = meta["log_tail"].value
    # Each argument arrived whole through sshd's shell: shlex.join quoted the command line.
    for arg in ("--rm", "--pull=always", "/dev/kfd", "/dev/dri", "video", image):
        assert f"arg: {arg}\n" in tail
    # stderr is in the same tail as stdout.
    assert "big: test log, exit 0" in tail


@pytest.mark.real
def test_check_fails_when_the_test_exits_nonzero(
    bake_env: Farm, sshd_server: SshdServer, gpu_fleet: Path
) -> None:
    graph = bake_env.graph
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
        key = gpu_test_check_key(graph, TEST_TARGET)
        assert _ui_status(instance, key, "gfx950") == AssetCheckExecutionResolvedStatus.FAILED
    # The image that failed is the one baked for this arch.
    built_test_image(bake_env, "gpu-bad", build_name(TEST_TARGET, "gfx950", result.run_id))
    digest = bake_env.registry.digest(graph.tags(TEST_TARGET, "gfx950")[0])
    assert evaluation.metadata["image"].value.endswith(f"@{digest}")


@pytest.mark.real
def test_check_fails_when_the_test_outlives_its_bound(
    bake_env: Farm, sshd_server: SshdServer, gpu_fleet: Path
) -> None:
    gpu_test = _resource(sshd_server, gpu_fleet, test_timeout_s=1.0, cleanup_timeout_s=1.0)
    with dg.instance_for_test() as instance:
        result = _run_check(bake_env.graph, gpu_test, instance, "gfx1100")
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
def test_check_tries_the_next_node_with_the_gpu(
    bake_env: Farm, sshd_server: SshdServer, gpu_fleet: Path
) -> None:
    with dg.instance_for_test() as instance:
        result = _run_check(bake_env.graph, _resource(sshd_server, gpu_fleet), instance, "gfx1201")
        evaluation = _evaluation(result)
        assert evaluation.passed
        assert evaluation.metadata["node"].value == "gpu-ok-2"
        warnings = [r.user_message for r in instance.all_logs(result.run_id) if r.level >= 30]
        assert any("gpu-gone: ssh connection to root@127.0.0.1" in w for w in warnings)
    # One bake, on the first node with the GPU (its builder answers, its ssh does not), before
    # any node was tried; the second node ran the digest it pushed.
    built_test_image(bake_env, "gpu-gone", build_name(TEST_TARGET, "gfx1201", result.run_id))
    digest = bake_env.registry.digest(bake_env.graph.tags(TEST_TARGET, "gfx1201")[0])
    assert evaluation.metadata["image"].value.endswith(f"@{digest}")


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
def test_unknown_host_key_is_refused_not_passed(
    bake_env: Farm, sshd_server: SshdServer, gpu_fleet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROCM_SSH_KNOWN_HOSTS", raising=False)
    graph = bake_env.graph
    gpu_test = GpuTestResource(
        fleet_file=str(gpu_fleet), key_filename=str(sshd_server.client_key), connect_timeout_s=15.0
    )
    with dg.instance_for_test() as instance:
        result = _run_check(graph, gpu_test, instance, "gfx942")
        assert not result.success
        assert result.get_asset_check_evaluations() == []
        failure = result.failure_data_for_node("base_test")
        assert failure is not None
        assert "no gfx942 node could run" in failure.error.message
        assert "not in known_hosts" in failure.error.message
        key = gpu_test_check_key(graph, TEST_TARGET)
        status = _ui_status(instance, key, "gfx942")
        assert status == AssetCheckExecutionResolvedStatus.EXECUTION_FAILED


@pytest.mark.real
def test_check_launched_alone_from_the_asset_page_runs(
    bake_env: Farm, sshd_server: SshdServer, gpu_fleet: Path
) -> None:
    # The UI's "Execute" on a check runs the implicit asset job subset to that check alone.
    graph = bake_env.graph
    defs = _defs(graph, _resource(sshd_server, gpu_fleet))
    key = gpu_test_check_key(graph, TEST_TARGET)
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection=set(), asset_check_selection={key}
    )
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, tags={PARTITION_TAG: "gfx942"})
        assert _evaluation(result).passed
    built_test_image(bake_env, "gpu-ok", build_name(TEST_TARGET, "gfx942", result.run_id))


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
