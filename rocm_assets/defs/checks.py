"""Test targets as asset checks: each runs its test image on a fleet node with the arch's GPU.

A test target (the bake file's TEST_TARGETS, e.g. pytorch-test) cannot run inside the build graph:
it needs /dev/kfd, which a BuildKit RUN step never has. So it is an asset check on the one target
it tests, partitioned by arch like that target: `docker run` of the test target's pushed tag for
the arch, over SSH on a node whose `gpus:` in fleet.yaml list that arch.

Outcomes, as the UI shows them:
- passed / failed: the container's exit status, with the log tail in the metadata;
- skipped: no node in the fleet has that GPU (or none that has it has an ssh address), or the run
  is a build run (the group jobs select the tested asset's checks; such a run pushes no new test
  image and must not hold its build node for a test). The check yields no result and the run
  succeeds, which Dagster resolves to SKIPPED (a planned check with no evaluation in a finished
  run); the reason is in the run's log. A failed WARN result would read as "failed", and a passed
  one would claim a test that never ran;
- execution failed: every node with the GPU was unreachable, or no partition was given.

One job per test target (`<test target>_job`) selects only its check. Dagster 1.13.27 drops the
partitions of a job that selects checks but no assets (assets/job/asset_job.py,
`_infer_and_validate_common_partitions_def` looks at assets only), so the arch is given as the run
tag `dagster/partition=<arch>`, which the check's context reads like any partition key.
"""

import shlex
from collections.abc import Iterator
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.common.constants import PARTITION_TAG
from rocm_assets.core.common.names import job_name
from rocm_assets.core.nodes.fleet import Fleet, FleetError, Node, load_fleet
from rocm_assets.core.nodes.probes import CommandResult, NodeCommandError, run_on_node
from rocm_assets.defs.assets import arch_partitions
from rocm_assets.defs.resources.bake import BakeResource, md_block

if TYPE_CHECKING:
    # A type only: importing dagster_internals loads Dagster's SQL storage (0.3 s).
    from rocm_assets.instance.dagster_internals import UnresolvedAssetJobDefinition

# Exit statuses of `docker run` itself, as opposed to the test's own.
_DOCKER_EXITS = {
    125: "docker could not start the container (image not pulled, or no such device)",
    126: "the image's command cannot be executed",
    127: "the image's command was not found",
}


class GpuTestResource(dg.ConfigurableResource):
    """Runs test images on fleet nodes with the GPU they need, over SSH with host keys checked."""

    fleet_file: str | None = Field(
        default=None, description="fleet.yaml; default $ROCM_FLEET_FILE, else ./fleet.yaml."
    )
    known_hosts: str | None = Field(
        default=None,
        description="Extra known_hosts file; default $ROCM_SSH_KNOWN_HOSTS. Unknown hosts are refused.",
    )
    key_filename: str | None = Field(
        default=None, description="SSH private key; default: the agent and ~/.ssh keys."
    )
    docker: str = Field(default="docker", description="The docker CLI on the GPU nodes.")
    connect_timeout_s: float = Field(default=10.0, description="Bound on each SSH phase.")
    test_timeout_s: float = Field(
        default=3600.0, description="Bound on one test run; past it the container is removed."
    )
    cleanup_timeout_s: float = Field(default=60.0, description="Bound on `docker rm -f`.")
    tail_lines: int = Field(default=60, description="Log lines kept in the check's metadata.")

    def fleet(self) -> Fleet:
        return load_fleet(self.fleet_file)

    def run(self, node: Node, argv: list[str], timeout_s: float) -> CommandResult:
        """`argv` on `node`, bounded by `timeout_s`; NodeCommandError if it cannot be reached."""
        connect = (
            {"key_filename": self.key_filename, "look_for_keys": False, "allow_agent": False}
            if self.key_filename
            else {}
        )
        return run_on_node(
            node,
            argv,
            timeout_s=timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            tail_lines=self.tail_lines,
            connect_kwargs=connect,
            known_hosts=self.known_hosts,
        )


def docker_run_argv(docker: str, image: str, container: str) -> list[str]:
    """The test container: the arch's GPU devices, the image as pushed (pulled every time)."""
    return [
        docker,
        "run",
        "--rm",
        "--pull=always",
        "--name",
        container,
        "--device",
        "/dev/kfd",
        "--device",
        "/dev/dri",
        "--group-add",
        "video",
        image,
    ]


def gpu_nodes(fleet: Fleet, arch: str) -> tuple[list[Node], list[Node]]:
    """Nodes with `arch` in `gpus`, in fleet order: those with an ssh address, those without."""
    having = [n for n in fleet.nodes if arch in n.gpus]
    return [n for n in having if n.ssh], [n for n in having if not n.ssh]


def _result(
    result: CommandResult, image: str, arch: str, test_timeout_s: float, removed: bool
) -> dg.AssetCheckResult:
    passed = result.exit_code == 0
    if result.timed_out:
        cleanup = "removed" if removed else "NOT removed (see the run log)"
        outcome = f"timed out after {test_timeout_s:g} s; the container was {cleanup}"
    elif passed:
        outcome = "passed"
    else:
        code = result.exit_code
        outcome = f"exited {code}" + (f": {_DOCKER_EXITS[code]}" if code in _DOCKER_EXITS else "")
    return dg.AssetCheckResult(
        passed=passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{image} on {result.node} ({arch}): {outcome}",
        metadata={
            "node": result.node,
            "arch": arch,
            "image": image,
            "command": dg.MetadataValue.text(result.command),
            "exit_code": result.exit_code if result.exit_code is not None else "timeout",
            "duration_s": dg.MetadataValue.float(round(result.duration_s, 3)),
            "log_tail": md_block(result.tail),
        },
    )


def gpu_test_check_key(graph: BakeGraph, test_target: str) -> dg.AssetCheckKey:
    """The check that runs `test_target`, on the target it tests."""
    return dg.AssetCheckKey(dg.AssetKey(graph.test_targets[test_target]), job_name(test_target))


def _gpu_test_check(graph: BakeGraph, test_target: str) -> dg.AssetChecksDefinition:
    tested = graph.test_targets[test_target]
    per_arch = tested in graph.per_arch
    key = gpu_test_check_key(graph, test_target)
    spec = dg.AssetCheckSpec(
        key.name,
        asset=key.asset_key,
        description=(
            f"Runs `{test_target}`'s image for the arch on a fleet node with that GPU (fleet.yaml "
            "`gpus:`), over SSH. Skipped where no node has the GPU; never passed without a run."
        ),
        # One result per arch partition of the tested target (a preview API in 1.13).
        partitions_def=arch_partitions(graph) if per_arch else None,
    )

    # can_subset: the check may yield nothing, which is how it is skipped.
    @dg.multi_asset_check(specs=[spec], name=key.name, can_subset=True)
    def gpu_test(
        context: dg.AssetCheckExecutionContext, gpu_test: GpuTestResource, bake: BakeResource
    ) -> Iterator[dg.AssetCheckResult]:
        building = context.job_def.asset_layer.selected_asset_keys
        if building:
            # A build run (group jobs select the tested asset's checks too): it rebuilds no test
            # image and must not hold its build node for a test, so the test waits for its job.
            context.log.warning(
                "%s skipped: this run builds %s; run %s_job after the test image is pushed",
                spec.name,
                ", ".join(sorted(k.to_user_string() for k in building)),
                spec.name,
            )
            return
        if per_arch and not context.has_partition_key:
            raise dg.Failure(
                description=f"{spec.name} tests one arch: launch it with the run tag "
                f"{PARTITION_TAG}=<arch> (one of {', '.join(graph.arches)})"
            )
        # A noarch target is built against the first arch (BakeGraph.build_arch).
        arch = context.partition_key if per_arch else graph.arches[0]
        tags = graph.tags(test_target, arch)
        if not tags:
            raise dg.Failure(description=f"{test_target} has no tag for {arch} in {graph.path}")
        image = tags[0]
        try:
            fleet = gpu_test.fleet()
        except FleetError as exc:
            raise dg.Failure(description=str(exc)) from None
        reachable, unreachable = gpu_nodes(fleet, arch)
        if not reachable:
            where = (
                f"{arch} is only on {', '.join(n.name for n in unreachable)}, which has no "
                "ssh address"
                if unreachable
                else f"no node in the fleet has a {arch} GPU (fleet.yaml `gpus:`)"
            )
            context.log.warning("%s skipped: %s", spec.name, where)
            return
        # Nothing else builds test targets: bake this one now on a GPU node's builder, from the
        # published image it tests, and run exactly the digest that bake pushed.
        partition = context.partition_key if per_arch else None
        with bake.holding(context, reachable[0]) as jobs:
            _, built = bake.bake(context, graph, test_target, partition, reachable[0], jobs)
        image = f"{image}@{built.digest}"
        container = f"rocm-test-{context.run.run_id[:8]}-{arch}"
        argv = docker_run_argv(gpu_test.docker, image, container)
        failures = []
        for node in reachable:
            context.log.info("running %s on %s: %s", image, node.name, shlex.join(argv))
            try:
                result = gpu_test.run(node, argv, gpu_test.test_timeout_s)
            except NodeCommandError as exc:
                # Another node with the GPU may answer; a test that ran is never retried.
                context.log.warning("%s", exc)
                failures.append(str(exc))
                continue
            removed = result.timed_out and _remove_container(context, gpu_test, node, container)
            yield _result(result, image, arch, gpu_test.test_timeout_s, removed)
            return
        raise dg.Failure(description=f"no {arch} node could run {image}: {'; '.join(failures)}")

    return gpu_test


def _remove_container(
    context: dg.AssetCheckExecutionContext, gpu_test: GpuTestResource, node: Node, container: str
) -> bool:
    """Whether `docker rm -f` removed the timed-out container (which would keep the GPU)."""
    # Closing the SSH channel does not stop the remote `docker run`; remove it by name.
    argv = [gpu_test.docker, "rm", "-f", container]
    try:
        removed = gpu_test.run(node, argv, gpu_test.cleanup_timeout_s)
    except NodeCommandError as exc:
        context.log.warning("could not remove %s: %s", container, exc)
        return False
    if removed.exit_code != 0:
        context.log.warning(
            "`%s` on %s ended %s: %s",
            removed.command,
            node.name,
            "in a timeout" if removed.timed_out else f"with exit {removed.exit_code}",
            " | ".join(removed.tail[-3:]),
        )
    return removed.exit_code == 0


def build_gpu_test_checks(graph: BakeGraph) -> list[dg.AssetChecksDefinition]:
    """One check per test target, on the target it tests; `graph` evaluated as bake pushes."""
    return [_gpu_test_check(graph, test) for test in graph.test_targets]


def build_gpu_test_jobs(graph: BakeGraph) -> list["UnresolvedAssetJobDefinition"]:
    """`<test target>_job` per test target, selecting its check alone (no build)."""
    return [
        dg.define_asset_job(
            f"{job_name(test)}_job",
            selection=dg.AssetSelection.checks(gpu_test_check_key(graph, test)),
            description=f"Runs `{test}` on a GPU node for the arch in the run tag {PARTITION_TAG}.",
        )
        for test in graph.test_targets
    ]
