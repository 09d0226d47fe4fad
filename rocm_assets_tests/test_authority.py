"""One placement authority (issue 11): never two builds on one machine, whatever submits them.

Each case that broke the guarantee before has a test here. Real: a SQLite Dagster instance with
rocm-assets' coordinator, the queued-run daemon's own `run_iteration`, the shipped rocm-bake.hcl
and the builder claims in the instance's storage; Dagster's MockedRunLauncher records launches.
The concurrent case across real processes and the real daemon is test_stress.py.
"""

import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.test_utils import create_run_for_test, instance_for_test

from rocm_assets.core.common.constants import (
    PLACEMENT_PLACED,
    PLACEMENT_WAITING,
    ROCM_BUILD_TAG,
    ROCM_BUILDER_TAG,
    ROCM_MAX_JOBS_TAG,
    ROCM_NODE_TAG,
    ROCM_PLACEMENT_TAG,
    ROCM_REFUSED_TAG,
    ROCM_WAITING_FOR_TAG,
)
from rocm_assets.instance import claims
from rocm_assets_tests.helpers import rocm_assets_cli, write_fleet
from rocm_assets_tests.helpers.instance import (
    FLEET,
    coordinator_config,
    end,
    iterate,
    messages,
    submit,
)

# ##### 1. ONE AUTHORITY: only the daemon's run-queue loop places


def test_run_workers_and_the_webserver_only_read_the_limits(fleet_file: Path) -> None:
    # Probing on, to show that no other process starts probes either.
    with instance_for_test(overrides=coordinator_config(fleet_file, probe_nodes=True)) as instance:
        run = submit(instance, "rocm-runtime", "gfx942")
        before = instance.get_run_by_id(run.run_id).tags
        # What a run worker's executor (pool limits) and the webserver's run-queue and pool
        # pages call: the instance's concurrency config, which asks the coordinator.
        for _ in range(3):
            instance.get_concurrency_config()
            instance.run_coordinator.get_run_queue_config()
        assert instance.get_run_by_id(run.run_id).tags == before
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.QUEUED
        assert claims.claims(instance) == {}
        coordinator = instance.run_coordinator
        assert coordinator._placer is None  # no plan was made, no file read for placement
        assert coordinator._probes._thread is None  # no SSH probe started
        # The daemon's own iteration is the one that places.
        iterate(instance)
        placed = instance.get_run_by_id(run.run_id)
        assert placed.tags[ROCM_PLACEMENT_TAG] == PLACEMENT_PLACED
        assert claims.holder(instance, placed.tags[ROCM_BUILDER_TAG]) == run.run_id
        coordinator._probes.stop()


# ##### 2. A LOCK PER MACHINE, HELD FROM PLACEMENT


def test_a_placed_run_holds_its_builder_before_it_is_launched(
    instance: dg.DagsterInstance,
) -> None:
    run = submit(instance, "rocm-runtime", "gfx942")
    # The tick alone: placed and tagged, not yet dequeued (the daemon launches it afterwards).
    instance.run_coordinator.placer.tick()
    placed = instance.get_run_by_id(run.run_id)
    assert placed.status == dg.DagsterRunStatus.QUEUED
    builder = placed.tags[ROCM_BUILDER_TAG]
    assert claims.holder(instance, builder) == run.run_id
    # An in-process run that wants that machine now finds it claimed: it cannot take it.
    other = create_run_for_test(instance, status=dg.DagsterRunStatus.STARTED)
    assert not claims.claim_builder(instance, builder, other.run_id)
    # The claim lasts until the run ends, then the next tick frees the machine.
    iterate(instance)
    end(instance, instance.get_run_by_id(run.run_id), DagsterEventType.RUN_CANCELED)
    iterate(instance)
    assert claims.holder(instance, builder) is None


# ##### 3. MACHINES, NOT NODE NAMES


def test_renaming_or_removing_a_node_never_frees_its_machine(
    instance: dg.DagsterInstance, fleet_file: Path
) -> None:
    first = submit(instance, "pytorch-src", None)
    iterate(instance)
    builder = instance.get_run_by_id(first.run_id).tags[ROCM_BUILDER_TAG]
    # The node is renamed in fleet.yaml while its build runs: same builder, same machine.
    fleet_file.write_text(FLEET.replace(f"name: {builder},", f"name: renamed-{builder},"))
    second = submit(instance, "rocm-runtime", "gfx950")
    third = submit(instance, "rocm-runtime", "gfx1100")
    fourth = submit(instance, "rocm-runtime", "gfx1201")
    for _ in range(2):
        iterate(instance)
    on = {
        r.run_id: r.tags.get(ROCM_BUILDER_TAG)
        for r in (instance.get_run_by_id(x.run_id) for x in (second, third, fourth))
    }
    placed = [b for b in on.values() if b]
    assert builder not in placed and placed  # others build, never on the renamed machine
    assert len(placed) == len(set(placed))  # one build per machine
    # Removed from the fleet altogether, and put back: still held by the first build.
    fleet_file.write_text(
        "\n".join(line for line in FLEET.splitlines() if f"builder: {builder}," not in line)
    )
    iterate(instance)
    fleet_file.write_text(FLEET)
    iterate(instance)
    assert claims.holder(instance, builder) == first.run_id


# ##### 4. PLACEMENT TAGS BELONG TO THE COORDINATOR


def test_placement_tags_supplied_at_submission_are_ignored(instance: dg.DagsterInstance) -> None:
    run = submit(
        instance,
        "rocm-runtime",
        "gfx942",
        tags={
            ROCM_NODE_TAG: "small",
            ROCM_MAX_JOBS_TAG: "99999",
            ROCM_PLACEMENT_TAG: PLACEMENT_PLACED,
            ROCM_BUILDER_TAG: "small",
        },
    )
    assert run.status == dg.DagsterRunStatus.QUEUED
    assert run.tags[ROCM_PLACEMENT_TAG] == PLACEMENT_WAITING
    assert run.tags[ROCM_MAX_JOBS_TAG] == "" and run.tags[ROCM_NODE_TAG] == ""
    assert "ignored placement tags supplied at submission: rocm/builder=small, " in messages(
        instance, run.run_id
    )
    assert claims.claims(instance) == {}
    iterate(instance)
    placed = instance.get_run_by_id(run.run_id)
    # The coordinator's choice: rocm-runtime's 10 GB push goes to the fastest link, not small.
    assert placed.tags[ROCM_NODE_TAG] == "big" and placed.tags[ROCM_MAX_JOBS_TAG] == "32"


# ##### 5. INPUTS ARE PUBLISHED OR THE BUILD WAITS


def _ended_build(instance: dg.DagsterInstance, build: str, status: DagsterEventType) -> None:
    run = create_run_for_test(
        instance, status=dg.DagsterRunStatus.STARTED, tags={ROCM_BUILD_TAG: build}
    )
    end(instance, run, status)


@pytest.mark.parametrize("ended", [DagsterEventType.RUN_CANCELED, DagsterEventType.RUN_FAILURE])
def test_a_build_waits_on_an_input_whose_last_run_did_not_publish(
    fleet_file: Path, ended: DagsterEventType
) -> None:
    with instance_for_test(
        overrides=coordinator_config(fleet_file, input_wait_seconds=3600)
    ) as instance:
        _ended_build(instance, "rocm-runtime@gfx942", ended)
        run = submit(instance, "pytorch-base", "gfx942")
        for _ in range(2):
            iterate(instance)
        waiting = instance.get_run_by_id(run.run_id)
        assert waiting.status == dg.DagsterRunStatus.QUEUED
        assert waiting.tags[ROCM_WAITING_FOR_TAG].startswith(
            "waits for rocm-runtime@gfx942 to be rebuilt: its last run "
        )
        status = "CANCELED" if ended == DagsterEventType.RUN_CANCELED else "FAILURE"
        assert f"ended {status}" in waiting.tags[ROCM_WAITING_FOR_TAG]
        assert claims.claims(instance) == {}
        # Rebuilt meanwhile: the input is published and the build starts.
        _ended_build(instance, "rocm-runtime@gfx942", DagsterEventType.RUN_SUCCESS)
        iterate(instance)
        assert instance.get_run_by_id(run.run_id).tags[ROCM_PLACEMENT_TAG] == PLACEMENT_PLACED


@pytest.mark.parametrize("outcome", ["failed", "materialized"])
def test_a_build_waits_while_its_inputs_run_is_ending(
    instance: dg.DagsterInstance, outcome: str
) -> None:
    # The build resource frees the builder when the bake ends, before the run records how it
    # ended: in that window the input is neither building nor failed, and was taken as published
    # (a demo placed base in the second runtime failed, and base failed its preflight).
    runtime = submit(instance, "rocm-runtime", "gfx942")
    iterate(instance)
    base = submit(instance, "pytorch-base", "gfx942")
    claims.release_run(instance, runtime.run_id)
    iterate(instance)
    waiting = instance.get_run_by_id(base.run_id)
    assert waiting.status == dg.DagsterRunStatus.QUEUED
    assert waiting.tags[ROCM_WAITING_FOR_TAG] == (
        f"waits for rocm-runtime@gfx942: its run {runtime.run_id[:8]} is ending"
    )
    assert claims.claims(instance) == {}
    ended = instance.get_run_by_id(runtime.run_id)
    if outcome == "failed":
        end(instance, ended, DagsterEventType.RUN_FAILURE)
        iterate(instance)
        # Known failed now: the dependent fails at once, naming the input and its run.
        assert instance.get_run_by_id(base.run_id).status == dg.DagsterRunStatus.FAILURE
        assert (
            f"input rocm-runtime@gfx942 is not published: its last run {runtime.run_id[:8]} "
            "ended FAILURE; build it with: "
        ) in messages(instance, base.run_id)
        return
    # Its materialization is recorded: the bake pushed, and base starts before the run ends.
    instance.report_dagster_event(
        DagsterEvent(
            DagsterEventType.ASSET_MATERIALIZATION.value,
            job_name=ended.job_name,
            event_specific_data=StepMaterializationData(
                dg.AssetMaterialization("rocm-runtime", partition="gfx942")
            ),
        ),
        run_id=ended.run_id,
    )
    iterate(instance)
    assert instance.get_run_by_id(base.run_id).tags[ROCM_PLACEMENT_TAG] == PLACEMENT_PLACED


def test_an_unpublished_input_fails_the_build_after_the_bound(fleet_file: Path) -> None:
    with instance_for_test(
        overrides=coordinator_config(fleet_file, input_wait_seconds=0)
    ) as instance:
        _ended_build(instance, "rocm-runtime@gfx942", DagsterEventType.RUN_CANCELED)
        run = submit(instance, "pytorch-base", "gfx942")
        iterate(instance)
        failed = instance.get_run_by_id(run.run_id)
        assert failed.status == dg.DagsterRunStatus.FAILURE
        text = messages(instance, run.run_id)
        assert "input rocm-runtime@gfx942 is not published: its last run " in text
        assert (
            "build it with: dagster asset materialize -m rocm_assets.definitions "
            "--select rocm-runtime --partition gfx942"
        ) in text


def test_a_waiting_in_process_run_is_refused_through_its_tag(fleet_file: Path) -> None:
    with instance_for_test(
        overrides=coordinator_config(fleet_file, input_wait_seconds=0)
    ) as instance:
        _ended_build(instance, "rocm-runtime@gfx942", DagsterEventType.RUN_FAILURE)
        # An in-process run waiting in line (its worker tags it so, and renews its lease).
        run = create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.STARTED,
            tags={ROCM_BUILD_TAG: "pytorch-base@gfx942", ROCM_PLACEMENT_TAG: PLACEMENT_WAITING},
        )
        claims.renew_lease(instance, run.run_id, time.time())
        iterate(instance)
        refused = instance.get_run_by_id(run.run_id)
        assert refused.status == dg.DagsterRunStatus.STARTED  # its worker fails its own step
        assert refused.tags[ROCM_REFUSED_TAG].startswith("input rocm-runtime@gfx942 is not ")


# ##### 6. NO RUN LOST


def test_any_exception_at_submission_fails_the_run_with_one_line(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object) -> None:
        raise KeyError("GPU_ARCHES")

    monkeypatch.setattr("rocm_assets.instance.coordinator.builds_of_run", broken)
    run = submit(instance, "rocm-runtime", "gfx942")
    assert run.status == dg.DagsterRunStatus.FAILURE
    failure = [
        e
        for e in instance.all_logs(run.run_id)
        if e.dagster_event and e.dagster_event.event_type == DagsterEventType.RUN_FAILURE
    ]
    assert len(failure) == 1
    assert failure[0].message == "rocm-assets could not queue this run: KeyError: 'GPU_ARCHES'"


def test_a_run_that_cannot_be_placed_fails_and_the_daemon_goes_on(
    instance: dg.DagsterInstance,
) -> None:
    ok = submit(instance, "rocm-runtime", "gfx942")
    # A queued build of a target the bake file no longer has (it was edited after submission).
    stale = submit(instance, "rocm-runtime", "gfx950")
    instance.add_run_tags(stale.run_id, {ROCM_BUILD_TAG: "retired-target@gfx950"})
    iterate(instance)
    assert instance.get_run_by_id(stale.run_id).status == dg.DagsterRunStatus.FAILURE
    assert (
        "rocm-assets could not place this run: ValueError: retired-target@gfx950 is not a build "
        "of rocm-bake.hcl any more"
    ) in messages(instance, stale.run_id)
    assert instance.get_run_by_id(ok.run_id).status == dg.DagsterRunStatus.STARTING
    iterate(instance)  # and the next iteration is fine


def test_a_dead_in_process_run_frees_its_builder(fleet_file: Path) -> None:
    with instance_for_test(overrides=coordinator_config(fleet_file, lease_seconds=5)) as instance:
        claims.ensure_builder_pools(instance, ["big"])
        run = create_run_for_test(
            instance, status=dg.DagsterRunStatus.STARTED, tags={ROCM_BUILD_TAG: "pytorch-src"}
        )
        assert claims.claim_builder(instance, "big", run.run_id)
        claims.renew_lease(instance, run.run_id, time.time() - 60)
        instance.run_coordinator.placer.tick(now=time.time() + 60)
        assert claims.holder(instance, "big") is None
        dead = instance.get_run_by_id(run.run_id)
        assert dead.status == dg.DagsterRunStatus.FAILURE
        assert "stopped renewing the claim on builder big" in messages(instance, run.run_id)


def test_plan_refuses_a_fleet_with_two_entries_for_one_machine(tmp_path: Path) -> None:
    fleet = write_fleet(
        tmp_path / "fleet.yaml",
        [
            {"name": "think", "builder": "snoc-think"},
            {"name": "think-again", "builder": "snoc-think"},
        ],
        cores=32,
        mem_gb=122,
        link_mbps=1000,
    )
    done = rocm_assets_cli("plan", "--fleet", str(fleet), "--strategy", "greedy")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"rocm-assets: error: {fleet}: nodes[1].builder: 'snoc-think' is also the builder of "
        "node 'think' (nodes[0]); a machine is one entry\n"
    )
