"""PlacementRunCoordinator on a real Dagster instance (SQLite), driven by the real dequeue daemon.

Real parts: `instance_for_test` storage, `QueuedRunCoordinatorDaemon.run_iteration`, the shipped
rocm-bake.hcl, and for the fan-out test a real code location served over gRPC. The launcher is
Dagster's MockedRunLauncher: it records launches; the test finishes runs by reporting events.
"""

import dataclasses
import json
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.run_coordinator import SubmitRunContext
from dagster._core.test_utils import (
    create_run_for_test,
    create_test_daemon_workspace_context,
    instance_for_test,
)
from dagster._core.workspace.load_target import ModuleTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from rocm_assets.cli.watch import frame
from rocm_assets.core.bake import load_graph
from rocm_assets.core.build.builds import Build, build_deps
from rocm_assets.core.common.constants import (
    FANOUT_PARENT,
    PLACEMENT_PLACED,
    PLACEMENT_WAITING,
    ROCM_BUILD_TAG,
    ROCM_BUILDER_TAG,
    ROCM_EST_FINISH_TAG,
    ROCM_FANOUT_OF_TAG,
    ROCM_FANOUT_TAG,
    ROCM_MAX_JOBS_TAG,
    ROCM_NODE_TAG,
    ROCM_PLACEMENT_TAG,
    ROCM_WAITING_FOR_TAG,
)
from rocm_assets.core.nodes.fleet import load_fleet
from rocm_assets.core.placement.farm import FollowSettings
from rocm_assets.core.placement.follow import COORDINATOR_STRATEGY
from rocm_assets.instance import claims
from rocm_assets.instance.coordinator import PlacementRunCoordinator
from rocm_assets.instance.history import finished_builds, measured_durations
from rocm_assets.instance.placer import PLAN_KEY
from rocm_assets.instance.settings import CoordinatorSettings
from rocm_assets_tests.helpers import PROJECT_ROOT
from rocm_assets_tests.helpers.instance import (
    BAKE,
    FLEET,
    HOLDING,
    ORIGIN,
    coordinator_config,
    end,
    iterate,
    messages,
    runs_in,
    submit,
)

# ##### CONFIG


def test_config_is_validated(fleet_file: Path) -> None:
    with pytest.raises(DagsterInvalidConfigError, match="not in enum type PlacementStrategy"):
        with instance_for_test(
            overrides=coordinator_config(fleet_file, strategy="fastest")
        ) as instance:
            assert instance.run_coordinator is not None
    with instance_for_test(overrides=coordinator_config(fleet_file, strategy="greedy")) as instance:
        assert isinstance(instance.run_coordinator, dg.QueuedRunCoordinator)


@pytest.mark.parametrize("path", ["dagster.yaml", "deploy/dagster.yaml"])
def test_the_shipped_settings_reach_the_placement_authority(path: str, fleet_file: Path) -> None:
    config = yaml.safe_load((PROJECT_ROOT / path).read_text())["run_coordinator"]["config"]
    # deploy/'s file paths come from env vars; the test's own files stand in.
    shipped = {k: v for k, v in config.items() if k not in ("bake_file", "fleet_file")}
    follow = {k: v for k, v in shipped.items() if k in FollowSettings.__dataclass_fields__}
    with instance_for_test(overrides=coordinator_config(fleet_file, **shipped)) as instance:
        coordinator = instance.run_coordinator
        assert isinstance(coordinator, PlacementRunCoordinator)
        settings = coordinator.settings
    assert settings.strategy == shipped["strategy"] == COORDINATOR_STRATEGY
    assert settings.follow == FollowSettings(**follow)
    assert set(follow) == {
        "replan_drift_margin",
        "replan_early_margin",
        "fill_idle_nodes",
        "solver_min_seconds",
        "solver_seconds_per_build",
        "solver_time_limit_seconds",
    }
    assert (settings.solver_workers, settings.lease_seconds, settings.input_wait_seconds) == (
        shipped["solver_workers"],
        shipped["lease_seconds"],
        shipped["input_wait_seconds"],
    )


def test_each_setting_is_declared_once_and_the_schema_follows(fleet_file: Path) -> None:
    declared = {
        f.name: f
        for cls in (CoordinatorSettings, FollowSettings)
        for f in dataclasses.fields(cls)
        if f.metadata.get("doc")
    }
    schema = PlacementRunCoordinator.config_type()
    for name, f in declared.items():
        assert schema[name].description == f.metadata["doc"], name
        if f.default is None:
            assert not schema[name].is_required, name
        else:
            assert schema[name].default_value == f.default, name
    # Not settings: the follower's internal knobs, and CoordinatorSettings.follow itself.
    assert {"solver_max_builds", "robust_samples", "follow"}.isdisjoint(schema)
    given = {"lease_seconds": 90, "replan_early_margin": None, "solver_min_seconds": 3}
    with instance_for_test(overrides=coordinator_config(fleet_file, **given)) as instance:
        settings = instance.run_coordinator.settings
    assert (settings.lease_seconds, settings.follow.replan_early_margin) == (90, None)
    assert settings.follow.solver_min_seconds == 3
    assert settings.probe_nodes is False and settings.fleet_file == str(fleet_file)


def test_limits_hold_waiting_runs_and_one_per_node(instance: dg.DagsterInstance) -> None:
    limits = instance.run_coordinator.get_run_queue_config().tag_concurrency_limits
    assert {"key": ROCM_PLACEMENT_TAG, "value": PLACEMENT_WAITING, "limit": 0} in limits
    assert {"key": ROCM_NODE_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits


# ##### SUBMISSION


def test_submit_queues_a_build_waiting_for_placement(instance: dg.DagsterInstance) -> None:
    run = submit(instance, "vllm-wheel", "gfx942")
    assert run.status == dg.DagsterRunStatus.QUEUED
    assert run.tags[ROCM_BUILD_TAG] == "vllm-wheel@gfx942"
    assert run.tags[ROCM_PLACEMENT_TAG] == PLACEMENT_WAITING
    assert run.tags[ROCM_NODE_TAG] == ""
    # submitting again is a no-op, as in QueuedRunCoordinator
    again = instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=None))
    assert again.status == dg.DagsterRunStatus.QUEUED


def test_runs_that_build_nothing_take_no_node(instance: dg.DagsterInstance) -> None:
    run = create_run_for_test(
        instance,
        job_name="__ASSET_JOB",
        status=dg.DagsterRunStatus.NOT_STARTED,
        remote_job_origin=ORIGIN,
        asset_selection=frozenset(),
        asset_check_selection=frozenset({dg.AssetCheckKey(dg.AssetKey("pytorch"), "pytorch_test")}),
    )
    queued = instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=None))
    assert not any(k.startswith("rocm/") for k in queued.tags)
    iterate(instance)
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTING


def test_retries_are_placed_afresh(instance: dg.DagsterInstance) -> None:
    first = submit(instance, "rocm-runtime", "gfx950")
    iterate(instance)
    node = instance.get_run_by_id(first.run_id).tags[ROCM_NODE_TAG]
    assert node
    instance.report_run_failed(instance.get_run_by_id(first.run_id))
    retry = submit(
        instance,
        "rocm-runtime",
        "gfx950",
        parent_run_id=first.run_id,
        root_run_id=first.run_id,
        tags={ROCM_NODE_TAG: node, ROCM_PLACEMENT_TAG: PLACEMENT_PLACED, ROCM_MAX_JOBS_TAG: "32"},
    )
    assert retry.tags[ROCM_NODE_TAG] == "" and retry.tags[ROCM_PLACEMENT_TAG] == PLACEMENT_WAITING
    logs = instance.all_logs(retry.run_id)
    assert any(f"not {node}, its parent's node" in (e.message or "") for e in logs)
    iterate(instance)
    placed = instance.get_run_by_id(retry.run_id)
    assert placed.tags[ROCM_PLACEMENT_TAG] == PLACEMENT_PLACED and placed.tags[ROCM_NODE_TAG]


# ##### PLACEMENT AT DEQUEUE TIME


def test_many_runs_one_build_per_node_and_dependency_gating(instance: dg.DagsterInstance) -> None:
    graph = load_graph(BAKE, {})
    arches = ["gfx942", "gfx1250"]
    expected = set()
    for target in graph.groups["default"]:
        for arch in arches if target in graph.per_arch else [None]:
            expected.add(f"{target}@{arch}" if arch else target)
    # noarch targets are requested once per arch, as two requests would; the duplicate waits
    for target in reversed(graph.groups["default"]):
        for arch in arches:
            submit(instance, target, arch if target in graph.per_arch else None)
    done: set[str] = set()
    for _ in range(80):
        iterate(instance)
        holding = runs_in(instance, *HOLDING)
        nodes = [r.tags[ROCM_NODE_TAG] for r in holding]
        assert len(nodes) == len(set(nodes)), f"two builds on one node: {nodes}"
        for run in holding:
            build = Build.parse(run.tags[ROCM_BUILD_TAG])
            deps = {str(d) for d in build_deps(graph, build)}
            assert deps <= done, f"{build} started before {deps - done}"
            assert run.tags[ROCM_EST_FINISH_TAG] and int(run.tags[ROCM_MAX_JOBS_TAG]) >= 1
        for run in holding:
            end(instance, run)
            done.add(run.tags[ROCM_BUILD_TAG])
        if not runs_in(instance, dg.DagsterRunStatus.QUEUED):
            break
    assert done == expected
    succeeded = sorted(
        r.tags[ROCM_BUILD_TAG] for r in runs_in(instance, dg.DagsterRunStatus.SUCCESS)
    )
    # every requested run ran; the second request of a noarch build waited for the first
    noarch = [b for b in expected if "@" not in b]
    assert succeeded == sorted([*expected, *noarch])


def test_waiting_runs_say_what_they_wait_for(instance: dg.DagsterInstance) -> None:
    base = submit(instance, "pytorch-base", "gfx942")
    runtime = submit(instance, "rocm-runtime", "gfx942")
    iterate(instance)
    assert instance.get_run_by_id(runtime.run_id).status == dg.DagsterRunStatus.STARTING
    waiting = instance.get_run_by_id(base.run_id)
    assert waiting.status == dg.DagsterRunStatus.QUEUED
    assert waiting.tags[ROCM_WAITING_FOR_TAG] == "waits for rocm-runtime@gfx942"


def test_in_process_runs_hold_their_builder(instance: dg.DagsterInstance) -> None:
    # `dagster asset materialize` runs without the queue; the builder it holds is busy.
    claims.ensure_builder_pools(instance, ["big", "mid", "small"])
    for builder in ("big", "mid"):
        held = create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.STARTED,
            asset_selection=frozenset({dg.AssetKey("pytorch")}),
            tags={"dagster/partition": "gfx950"},
        )
        assert claims.claim_builder(instance, builder, held.run_id)
    run = submit(instance, "pytorch-src", None)
    iterate(instance)
    assert instance.get_run_by_id(run.run_id).tags[ROCM_NODE_TAG] == "small"
    assert claims.holder(instance, "small") == run.run_id


def test_a_claim_left_by_a_daemon_killed_mid_placement_is_undone(
    instance: dg.DagsterInstance,
) -> None:
    # The daemon was SIGKILLed between claiming a builder for a queued run and tagging the run
    # placed: the run still waits, and nothing else would ever free that builder.
    run = submit(instance, "rocm-runtime", "gfx942")
    claims.ensure_builder_pools(instance, ["big", "mid", "small"])
    assert claims.claim_builder(instance, "big", run.run_id)
    claims.renew_lease(instance, run.run_id, time.time())
    # Within the grace it may be a tick still at work (another daemon): left alone.
    iterate(instance)
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.QUEUED
    assert claims.claims(instance) == {"big": run.run_id}
    claims.renew_lease(instance, run.run_id, time.time() - 60)
    iterate(instance)
    placed = instance.get_run_by_id(run.run_id)
    assert placed.status == dg.DagsterRunStatus.STARTING
    assert placed.tags[ROCM_PLACEMENT_TAG] == PLACEMENT_PLACED
    assert claims.claims(instance) == {placed.tags[ROCM_BUILDER_TAG]: run.run_id}
    assert "the claim is undone and the run placed afresh" in messages(instance, run.run_id)


def test_a_bad_fleet_file_never_crashes_the_daemon(
    instance: dg.DagsterInstance, fleet_file: Path
) -> None:
    run = submit(instance, "rocm-runtime", "gfx942")
    fleet_file.write_text("nodes: [}\n")
    iterate(instance)  # no exception: the run just stays queued
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.QUEUED
    fleet_file.write_text(FLEET)
    iterate(instance)
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTING


# ##### FAN-OUT OF A MULTI-BUILD REQUEST (real code location over gRPC)


@pytest.fixture
def workspace_target(monkeypatch: pytest.MonkeyPatch) -> ModuleTarget:
    monkeypatch.setenv("ROCM_BAKE_FILE", str(BAKE))
    return ModuleTarget(
        module_name="rocm_assets.definitions",
        attribute=None,
        working_directory=str(PROJECT_ROOT),
        location_name="rocm_assets",
    )


def test_multi_build_request_fans_out(
    instance: dg.DagsterInstance, workspace_target: ModuleTarget
) -> None:
    from dagster._core.definitions.selector import JobSubsetSelector

    keys = [dg.AssetKey("vllm"), dg.AssetKey("vllm-wheel"), dg.AssetKey("lmcache-wheel")]
    with create_test_daemon_workspace_context(workspace_target, instance) as context:
        location = context.create_request_context().get_code_location("rocm_assets")
        repo = next(iter(location.get_repositories().values()))
        job = location.get_job(
            JobSubsetSelector("rocm_assets", repo.name, "__ASSET_JOB", None, keys)
        )
        plan = location.get_execution_plan(
            job, {}, step_keys_to_execute=None, known_state=None, instance=instance
        )
        request = instance.create_run(
            job_name="__ASSET_JOB",
            run_id=None,
            run_config={},
            resolved_op_selection=None,
            step_keys_to_execute=None,
            status=dg.DagsterRunStatus.NOT_STARTED,
            op_selection=None,
            root_run_id=None,
            parent_run_id=None,
            tags={"dagster/partition": "gfx1201", "team": "rocm"},
            job_snapshot=job.job_snapshot,
            execution_plan_snapshot=plan.execution_plan_snapshot,
            parent_job_snapshot=job.parent_job_snapshot,
            remote_job_origin=job.get_remote_origin(),
            job_code_origin=job.get_python_origin(),
            asset_selection=frozenset(keys),
            asset_check_selection=None,
            asset_graph=repo.asset_graph,
        )
        instance.submit_run(request.run_id, context.create_request_context())
        parent = instance.get_run_by_id(request.run_id)
        assert parent.tags[ROCM_FANOUT_TAG] == FANOUT_PARENT
        assert ROCM_NODE_TAG not in parent.tags  # the request's own run takes no node
        children = list(instance.get_runs(dg.RunsFilter(tags={ROCM_FANOUT_OF_TAG: request.run_id})))
        assert sorted(c.tags[ROCM_BUILD_TAG] for c in children) == [
            "lmcache-wheel@gfx1201",
            "vllm-wheel@gfx1201",
            "vllm@gfx1201",
        ]
        for child in children:
            assert child.status == dg.DagsterRunStatus.QUEUED
            assert child.asset_selection == {dg.AssetKey(child.tags[ROCM_BUILD_TAG].split("@")[0])}
            assert child.tags["dagster/partition"] == "gfx1201" and child.tags["team"] == "rocm"
        list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(context))
        started = {r.tags.get(ROCM_BUILD_TAG, "parent") for r in runs_in(instance, *HOLDING)}
        # gating: only lmcache-wheel's inputs are outside the request; vllm waits for it
        assert started == {"parent", "lmcache-wheel@gfx1201"}


# ##### PREFLIGHT AT SUBMISSION (real docker-registry)


@pytest.mark.real
def test_submission_preflight_fails_a_run_whose_input_is_missing(
    instance: dg.DagsterInstance, registry_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = registry_server.new_repo("coordinator")
    monkeypatch.setenv("ROCM_REGISTRY_URL", registry_server.url)
    monkeypatch.setenv("REGISTRY", f"{registry_server.host}/{prefix}")
    graph = load_graph(BAKE)
    image = graph.tags("vllm", "gfx942")[0]

    failed = submit(instance, "vllm-wheel", "gfx942")
    assert failed.status == dg.DagsterRunStatus.FAILURE
    messages = "\n".join(e.message or "" for e in instance.all_logs(failed.run_id))
    assert (
        f"missing {image}: needed by vllm-wheel; built by asset vllm partition gfx942" in messages
    )
    assert (
        "dagster asset materialize -m rocm_assets.definitions --select vllm --partition gfx942"
        in messages
    )

    # the input an earlier run of the same request will publish does not count as missing
    queued_vllm = submit(instance, "vllm", "gfx942")
    assert queued_vllm.status == dg.DagsterRunStatus.FAILURE  # its own inputs are missing
    repo, tag = image.removeprefix(f"{registry_server.host}/").rsplit(":", 1)
    registry_server.push_image(repo, tag, b"vllm")
    ok = submit(instance, "vllm-wheel", "gfx942")
    assert ok.status == dg.DagsterRunStatus.QUEUED


def test_submission_preflight_never_fails_a_run_for_a_registry_error(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROCM_REGISTRY_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("REGISTRY", "127.0.0.1:9")
    run = submit(instance, "vllm-wheel", "gfx942")
    assert run.status == dg.DagsterRunStatus.QUEUED
    messages = [e.message or "" for e in instance.all_logs(run.run_id)]
    assert any(
        "preflight at submission skipped: registry http://127.0.0.1:9" in m for m in messages
    )


def test_finished_inputs_are_known_by_the_node_that_built_them(
    instance: dg.DagsterInstance,
) -> None:
    """Locality: a dependent placed where its input was built pulls nothing (`pushed`)."""

    for node in ("big", "mid"):  # rebuilt: the newer build's node wins
        run = create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.STARTED,
            tags={ROCM_BUILD_TAG: "rocm-runtime@gfx942", ROCM_NODE_TAG: node},
        )
        end(instance, run)
    create_run_for_test(
        instance,
        status=dg.DagsterRunStatus.FAILURE,
        tags={ROCM_BUILD_TAG: "pytorch-src", ROCM_NODE_TAG: "small"},
    )
    import time

    built, failed = finished_builds(
        instance,
        {Build("rocm-runtime", "gfx942"), Build("pytorch-src", None)},
        {"big", "mid", "small"},
        time.time(),
    )
    assert built == {Build("rocm-runtime", "gfx942"): "mid"}  # a failed build published nothing
    assert list(failed) == [Build("pytorch-src", None)]
    assert failed[Build("pytorch-src", None)][0].endswith("ended FAILURE")


# ##### THE FOLLOWED PLAN, VISIBLE


def test_the_followed_plan_is_stored_and_watch_shows_it(
    instance: dg.DagsterInstance, fleet_file: Path
) -> None:
    for target, arch in (
        ("rocm-runtime", "gfx942"),
        ("pytorch-base", "gfx942"),
        ("pytorch", "gfx942"),
    ):
        submit(instance, target, arch)
    submit(instance, "pytorch-src", None)
    iterate(instance)
    stored = json.loads(instance.run_storage.get_cursor_values({PLAN_KEY})[PLAN_KEY])
    planned = [b for queue in stored["queues"].values() for b, _, _ in queue]
    # Each build is planned once, on the fleet's nodes; those that wait are in it (the two
    # starting now drop out once a solver's plan for the same builds is taken).
    assert len(planned) == len(set(planned))
    assert (
        {"pytorch-base@gfx942", "pytorch@gfx942"}
        <= set(planned)
        <= {
            "pytorch-base@gfx942",
            "pytorch@gfx942",
            "pytorch-src",
            "rocm-runtime@gfx942",
        }
    )
    assert set(stored["queues"]) <= {"big", "small", "mid"}
    assert stored["expected_finish"] > time.time() and stored["strategy"]
    lines = frame(instance, load_fleet(fleet_file), time.time(), "http://ui")
    header = next(line for line in lines if line.startswith("plan ("))
    assert "expected finish" in header
    assert any("pytorch@gfx942 +" in line for line in lines)


def test_a_cache_hit_is_not_taken_as_a_build_time(
    instance: dg.DagsterInstance, fleet_file: Path
) -> None:
    def built(seconds: float, cache_hit: bool) -> None:
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                "pytorch",
                partition="gfx942",
                metadata={
                    "node": "big",
                    "max_jobs": 32,
                    "duration_s": seconds,
                    "cache_hit": cache_hit,
                },
            )
        )

    graph, fleet = load_graph(BAKE, {}), load_fleet(fleet_file)
    built(6000.0, cache_hit=False)
    built(40.0, cache_hit=True)  # every layer cached: the bake only re-pushed the manifest
    built(7000.0, cache_hit=False)
    # Both real builds, minus the push the model adds itself (6 GB at 1000 Mbit/s = 48 s).
    assert measured_durations(instance, graph, fleet) == {("pytorch", "big", 32): 6452.0}
