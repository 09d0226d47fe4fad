"""A build node's network cut mid-build: a short cut is survived, a long one ends the build.

Issue 29's item 9, end to end. The node is a separate host (rocm_assets_tests/servers/netns.py:
its own network namespace, sshd and dockerd, a builder reached through a docker context over
SSH) pushing to a registry on the host's side of its link. The farm is as deployed
(rocm_assets_tests/helpers/daemon_farm.py): rocm-assets' coordinator probing the fleet over SSH
every PROBE_S, the real `dagster-daemon run`, and a code server of its own whose run workers
bake on the node, each watching the node with the farm's own probe (core/nodes/watch.py, its
shipped figures: every 10 s, unreachable after 45 s).

- A cut of SHORT_CUT_S (under TCP's ~25 s) mid-build: the build completes, published once.
- A cut that lasts: the build fails within BOUND_S of the cut, naming the node and the probe's
  reason; its builder claim is freed; the daemon's probe marks the node unreachable, so a queued
  build is not placed while it is cut and says so, and `rocm-assets watch` shows UNREACHABLE.
  Healed, the queued build is placed there and completes.

Throughout: each node's BuildKit history shows no two records at once, the daemon logs no
traceback, and every run ends.
"""

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest

from rocm_assets.core.build.guard import GRACE_S
from rocm_assets.core.common.constants import ROCM_WAITING_FOR_TAG
from rocm_assets.core.nodes.watch import EVERY_S, UNREACHABLE_S
from rocm_assets.instance import claims
from rocm_assets_tests.helpers import rocm_assets_cli, wait_until
from rocm_assets_tests.helpers.daemon_farm import (
    BUILD_PREFIX,
    assert_each_success_baked_once,
    assert_nothing_held,
    build_runs,
    history_name,
    make_daemon_farm,
    placement,
    running_farm,
    submit,
)
from rocm_assets_tests.servers.dockerd import Builders, Dockerd, copy_e2e
from rocm_assets_tests.servers.netns import HostRegistry, RemoteNode

pytestmark = [pytest.mark.real, pytest.mark.slow]

ARCH = "gfx942"
HOLD_S = 30
SHORT_CUT_S = 20.0
# The daemon's probe interval here (dagster.yaml's probe_interval_seconds; 60 s shipped).
PROBE_S = 5
# Silence the watch waits out, its probe interval, one probe's timeout, the guard's grace, and
# the run's own ending: a build on a cut link has ended by then.
BOUND_S = UNREACHABLE_S + EVERY_S + 5.5 + GRACE_S + 15.0
GUARD_S = 600.0
# A target that holds its node far longer than the test waits.
LONG_HCL = """
variable "LONG_HOLD_S" {
  default = "600"
}

target "base-long" {
  inherits = ["base"]
  tags     = ["${REGISTRY}/e2e/base-long:${GPU_ARCH}"]
  args     = { HOLD_S = LONG_HOLD_S }
}
"""


def _node_builders(node: RemoteNode) -> Builders:
    """The node's builder as the Builders the helpers read history from (over SSH)."""
    engine = Dockerd(node.docker_host, node.engine_root, node.dockerd_log, 0.0)
    return Builders(node.config_dir, {node.builder: engine}, dict(node.env))


def _ssh_home(node: RemoteNode, home: Path) -> Path:
    """A HOME whose default SSH key is the node's client key: the farm's probes log in with it."""
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    shutil.copy(node.client_key, key)
    os.chmod(key, 0o600)
    return home


def _run_of(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRun:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return run


def _step_failures(instance: dg.DagsterInstance, run_id: str) -> str:
    """What the run's failed steps said: the UI's reason for the failure."""
    return "\n".join(
        e.dagster_event.step_failure_data.error.to_string()
        for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
        if e.dagster_event is not None and e.dagster_event.step_failure_data.error is not None
    )


def _holds_the_node(instance: dg.DagsterInstance, run_id: str, seconds: str) -> bool:
    """The run's bake reached its held RUN step on the node (its log says so)."""
    return any(f'sleep "{seconds}"' in (e.message or "") for e in instance.all_logs(run_id))


def test_a_cut_link_is_survived_when_short_and_ends_the_build_when_long(
    remote_node: RemoteNode,
    remote_registry: HostRegistry,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    builders = _node_builders(remote_node)
    farm = make_daemon_farm(
        tmp_path / "farm",
        builders,
        remote_registry,
        copy_e2e(tmp_path / "e2e", extra=LONG_HCL),
        {remote_node.name: remote_node.builder},
        ssh={remote_node.name: remote_node.ssh_address},
        coordinator={"probe_nodes": True, "probe_interval_seconds": PROBE_S},
        HOLD_S=str(HOLD_S),
        HOME=str(_ssh_home(remote_node, tmp_path / "home")),
        ROCM_SSH_KNOWN_HOSTS=str(remote_node.known_hosts),
    )
    with running_farm(farm) as (instance, workspace):
        # A short cut mid-build: TCP holds the connection, the build completes.
        short = submit(instance, workspace, target="base", partition=ARCH)
        wait_until(
            lambda: _holds_the_node(instance, short, str(HOLD_S)), "base's held step", GUARD_S
        )
        with remote_node.link_cut():
            time.sleep(SHORT_CUT_S)
        wait_until(lambda: _run_of(instance, short).is_finished, "base to end", GUARD_S)
        assert _run_of(instance, short).status == dg.DagsterRunStatus.SUCCESS, farm.logs_tail()

        # A long cut: the build ends within BOUND_S, the queued one waits for the node.
        long = submit(instance, workspace, target="base-long", partition=ARCH)
        wait_until(lambda: _holds_the_node(instance, long, "600"), "base-long's held step", GUARD_S)
        queued = submit(instance, workspace, target="tool-wheel")
        try:
            remote_node.link_down()
            cut = time.monotonic()
            wait_until(
                lambda: (
                    "no build node answers its probe"
                    in _run_of(instance, queued).tags.get(ROCM_WAITING_FOR_TAG, "")
                ),
                "the queued build to say the node does not answer",
                PROBE_S + 2 * 6.0 + 5.0,
                poll_s=0.5,
            )
            seen_s = time.monotonic() - cut
            watched = rocm_assets_cli("watch", "--once", env=farm.env, timeout_s=60)
            assert watched.returncode == 0, watched.stderr
            assert re.search(rf"^\s*{remote_node.name}\s+UNREACHABLE\b", watched.stdout, re.M), (
                watched.stdout
            )
            wait_until(
                lambda: _run_of(instance, long).is_finished, "base-long to end", BOUND_S, poll_s=0.5
            )
            ended_s = time.monotonic() - cut
            assert _run_of(instance, long).status == dg.DagsterRunStatus.FAILURE
            failure = _step_failures(instance, long)
            assert f"node {remote_node.name} unreachable for " in failure, failure
            assert "bake was stopped" in failure
            assert claims.claims(instance) == {}
            # Still cut: the queued build was not placed on the node.
            assert _run_of(instance, queued).status == dg.DagsterRunStatus.QUEUED
            assert not remote_node.link_is_up()
        finally:
            remote_node.link_up()
        healed = time.time()
        wait_until(lambda: _run_of(instance, queued).is_finished, "tool-wheel to end", GUARD_S)
        placed = placement(instance, queued)
        assert placed is not None and placed[0] > healed
        runs = build_runs(instance)
        assert {r.run_id: r.status for r in runs} == {
            short: dg.DagsterRunStatus.SUCCESS,
            long: dg.DagsterRunStatus.FAILURE,
            queued: dg.DagsterRunStatus.SUCCESS,
        }
        assert_nothing_held(instance)
        assert_each_success_baked_once(farm, runs, [remote_node.builder])
        [stopped] = builders.history(remote_node.builder, history_name(_run_of(instance, long)))
        assert stopped.status != "Completed"
    assert builders.overlaps(BUILD_PREFIX, {history_name(r) for r in runs}) == []
    assert "Traceback" not in farm.log("daemon"), farm.log("daemon")[-3000:]
    record_property("unreachable_seen_by_placement_after_s", round(seen_s, 1))
    record_property("long_cut_build_ended_after_s", round(ended_s, 1))
    record_property("queued_build_placed_after_heal_s", round(placed[0] - healed, 1))
