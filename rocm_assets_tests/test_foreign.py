"""Builds that are not this farm's hold their nodes (issue 44).

Pure parts first: which history records are foreign and how their ends are estimated
(`rocm_assets.core.nodes.foreign`), the follower's re-plan when a hold ends early and its
waiting reasons, the stored list `watch` reads, and `watch`'s frame.

Then real parts: Debian 13's dockerd 26 with buildx 0.29 (and 0.13 for an unreadable history),
foreign builds started by hand with `docker buildx build` (named, unnamed, and one of a second
farm under this project's prefix with a run id this instance does not know), read by the
coordinator's `ForeignWatch` with a real SQLite instance; a worker's look just before its bake;
`rocm-assets plan --probe` around a running foreign build; and the queued-run daemon's iteration
with a builder that does not answer.
"""

import json
import logging
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest
from dagster._core.test_utils import instance_for_test

from rocm_assets.cli.watch import render
from rocm_assets.core.build.builds import Build
from rocm_assets.core.build.invocation import HistoryRecord
from rocm_assets.core.common.constants import ROCM_WAITING_FOR_TAG
from rocm_assets.core.nodes.fleet import load_fleet
from rocm_assets.core.nodes.foreign import ForeignBuild, foreign_builds
from rocm_assets.core.placement.cost import CostModel
from rocm_assets.core.placement.farm import FarmState, Hold, Running
from rocm_assets.core.placement.follow import PlanFollower
from rocm_assets.instance import authority
from rocm_assets.instance.foreign import ForeignWatch
from rocm_assets.instance.stored_plan import foreign_json, read_foreign
from rocm_assets_tests.helpers import rocm_assets_cli, wait_until, write_fleet
from rocm_assets_tests.helpers.instance import coordinator_config, iterate, messages, submit
from rocm_assets_tests.servers.dockerd import (
    E2E_BUILDER,
    Builders,
    Dockerd,
    hand_build,
    make_builders,
)

NOW = 1_000_000.0
SIBLING = "rocm-sibling/torch/gfx942/r7"


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e9):09d}Z"


def record(name: str, started: float, status: str = "Running") -> HistoryRecord:
    return HistoryRecord(f"b1/b1/{uuid.uuid4().hex[:12]}", name, status, _stamp(started), None)


@pytest.fixture
def small_fleet(tmp_path: Path):
    return load_fleet(
        write_fleet(
            tmp_path / "fleet.yaml",
            [{"name": "demo-big", "builder": "b1", "cores": 32, "mem_gb": 122, "link_mbps": 1000}],
            {"torch": {"seconds": 2400, "size_gb": 1.0}},
        )
    )


# ---- which records are foreign, and their estimates ----
def test_a_running_record_not_of_this_farms_runs_is_foreign(small_fleet) -> None:
    node = small_fleet.nodes[0]
    cost = CostModel(small_fleet)
    ours, other_farm = (
        "a1b2c3d4-0000-0000-0000-000000000001",
        "ffff0000-0000-0000-0000-0000000000aa",
    )
    records = [
        record(SIBLING, NOW - 180),
        record("foreign/Dockerfile.demo-mid", NOW - 60),
        record(f"rocm-pytorch-build/torch/gfx942/{ours}", NOW - 30),
        record(f"rocm-pytorch-build/torch/gfx942/{other_farm}", NOW - 20),
        record("rocm-sibling/torch/gfx942/r6", NOW - 900, status="Completed"),
    ]
    found = foreign_builds(node, records, {ours}.__contains__, cost, small_fleet, NOW, 1800.0)
    assert [b.name for b in found] == [
        SIBLING,
        "foreign/Dockerfile.demo-mid",
        f"rocm-pytorch-build/torch/gfx942/{other_farm}",
    ]
    sibling, unnamed, second_farm = found
    # A target the fleet costs: the cost model's build and push on that node, from its start.
    expected = cost.build_s("torch", node) + cost.push_s("torch", node)
    assert sibling.est_end_s == pytest.approx(NOW - 180 + expected, abs=0.01)
    assert sibling.estimated_by == "the cost model" and sibling.named
    assert sibling.what(NOW) == (
        f"demo-big is building {SIBLING} (not this farm's), running 3m00s, "
        f"est. end in {round(expected - 180) // 60}m{round(expected - 180) % 60:02d}s"
    )
    # buildx's derived name is no convention name: the stated default estimates it.
    assert not unnamed.named and unnamed.label == "unnamed build (foreign/Dockerfile.demo-mid)"
    assert (unnamed.estimated_by, unnamed.est_end_s) == ("the default", NOW - 60 + 1800.0)
    # Another farm's build under this project's prefix is estimated like any named one.
    assert second_farm.named and second_farm.estimated_by == "the cost model"


def test_an_unknown_target_gets_the_default_and_an_overrun_is_held_a_step_longer(
    small_fleet,
) -> None:
    node = small_fleet.nodes[0]
    cost = CostModel(small_fleet)
    [unknown] = foreign_builds(
        node, [record("rocm-sibling/vllm/gfx942/r9", NOW - 10)], lambda _: False, cost,
        small_fleet, NOW, 600.0,
    )  # fmt: skip
    assert (unknown.estimated_by, unknown.est_end_s) == ("the default", NOW - 10 + 600.0)
    # 700 s in with a 600 s estimate: held to the end of the overrun step (150 s) it is in.
    [late] = foreign_builds(
        node, [record("x", NOW - 700)], lambda _: False, cost, small_fleet, NOW, 600.0
    )
    assert late.est_end_s == pytest.approx(NOW - 700 + 600 + 150)
    # A record stamped in the future (a node's clock ahead) is taken as starting now.
    [ahead] = foreign_builds(
        node, [record("x", NOW + 50)], lambda _: False, cost, small_fleet, NOW, 600.0
    )
    assert ahead.started_s == NOW


# ---- the follower ----
class _Node:
    def __init__(self, name: str) -> None:
        self.name, self.cores, self.mem_gb, self.link_mbps = name, 32, 122.0, 1000.0


def test_the_plan_is_remade_when_a_foreign_build_ends_before_its_estimate(small_fleet) -> None:
    nodes = (_Node("n1"), _Node("n2"))
    cost = CostModel(small_fleet)
    a, b = Build("torch", "gfx942"), Build("torch", "gfx1100")
    pending = {a: frozenset(), b: frozenset()}
    what = "n1 is building unnamed build (x) (not this farm's), running 0s, est. end in 30m00s"
    follower = PlanFollower()
    held = [Hold("n1", 0.0, 1800.0, what)]
    first = follower.tick(FarmState(0.0, pending, {}, nodes, cost, holds=held))
    # One build starts on n2; the other waits for n2 (n1 is held for 30 minutes).
    [start] = first.starts
    assert start.node == "n2"
    running = {start.build: Running("n2", 0.0, start.est_finish_s)}
    rest = {k: v for k, v in pending.items() if k != start.build}
    follower.tick(FarmState(5.0, rest, running, nodes, cost, holds=held))
    # The foreign build ends at 10 s: the plan is re-made, and the waiting build takes n1.
    after = follower.tick(FarmState(10.0, rest, running, nodes, cost, holds=[]))
    assert follower.plan().reason == "n1 is free before its hold's estimated end"
    assert [(s.build, s.node) for s in after.starts] == [(next(iter(rest)), "n1")]


def test_the_build_next_on_a_held_node_says_what_holds_it(small_fleet) -> None:
    nodes = (_Node("n1"),)
    a = Build("torch", "gfx942")
    follower = PlanFollower()
    for now, age in ((0.0, "0s"), (120.0, "2m00s")):
        what = f"n1 is building {SIBLING} (not this farm's), running {age}, est. end in 9m"
        decision = follower.tick(
            FarmState(now, {a: frozenset()}, {}, nodes, CostModel(small_fleet),
                      holds=[Hold("n1", 0.0, 600.0, what)])
        )  # fmt: skip
        assert decision.waiting[a].reason == f"next on n1 once it is free: {what}"


# ---- stored for watch, and shown ----
def test_watch_shows_the_foreign_build_holding_its_node(small_fleet) -> None:
    builds = [
        ForeignBuild("demo-big", "b1/b1/x", SIBLING, True, NOW - 180, NOW + 2460, "the cost model"),
        ForeignBuild("demo-big", "b1/b1/y", "ctx/Dockerfile", False, NOW - 5, NOW + 60, "the default"),
    ]  # fmt: skip
    stored = read_foreign(json.dumps(foreign_json(builds)))
    assert stored == builds
    assert read_foreign("not json") == [] and read_foreign('[{"node": 1}]') == []
    lines = render([], small_fleet.nodes, NOW, "http://ui", foreign=stored)
    assert "nodes busy 1/1" in lines[0]
    assert (
        f"held by {SIBLING} (not this farm's), running 3m00s, est. end in 41m00s "
        "(by the cost model)" in lines[1]
    )
    assert "held by unnamed build (ctx/Dockerfile) (not this farm's), running 5s" in lines[2]
    assert not any(line.endswith("idle") for line in lines)


# ---- real: dockerd 26 + buildx, builds started by hand ----
@pytest.fixture
def hand_builds(builders: Builders, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Builds started by hand on a builder (`hand_build`), killed when the test ends."""
    started: list[subprocess.Popen] = []

    def start(builder: str, seconds: int, name: str | None = None) -> subprocess.Popen:
        started.append(hand_build(builders, builder, seconds, tmp_path / "foreign", name))
        return started[-1]

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _env_of(monkeypatch: pytest.MonkeyPatch, builders: Builders) -> None:
    """The daemon's environment reaches the builders (ForeignWatch reads os.environ)."""
    for key in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", builders.env["DOCKER_CONFIG"])


def _fleet(tmp_path: Path, builder: str = E2E_BUILDER):
    return load_fleet(
        write_fleet(
            tmp_path / "fleet.yaml",
            [
                {
                    "name": "demo-big",
                    "builder": builder,
                    "cores": 32,
                    "mem_gb": 122,
                    "link_mbps": 1000,
                }
            ],
            {"torch": {"seconds": 2400, "size_gb": 1.0}},
        )
    )


@pytest.mark.real
def test_foreign_builds_started_by_hand_are_seen_and_this_farms_are_not(
    builders: Builders,
    hand_builds: Callable[..., subprocess.Popen],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    record_property: Callable[[str, object], None],
) -> None:
    _env_of(monkeypatch, builders)
    fleet = _fleet(tmp_path)
    other_farm = f"rocm-pytorch-build/torch/gfx942/{uuid.uuid4()}"
    with instance_for_test() as instance:
        ours = dg.DagsterRun(job_name="__ASSET_JOB", run_id=str(uuid.uuid4()))
        instance.add_run(ours)
        own = f"rocm-pytorch-build/torch/gfx942/{ours.run_id}"
        for name in (SIBLING, None, other_farm, own):
            hand_builds(E2E_BUILDER, 12, name)
        watch = ForeignWatch(instance, every_s=0.5, default_s=1800.0)
        cost = CostModel(fleet)
        seen: list[ForeignBuild] = []

        def three_seen() -> bool:
            watch.refresh(fleet, time.time())
            seen[:] = watch.builds(fleet, cost, time.time())
            return len(seen) >= 3

        try:
            wait_until(three_seen, "three foreign builds in the history", 60.0, poll_s=0.2)
            found_at = time.time()
            labels = sorted(b.label for b in seen)
            assert len(seen) == 3 and own not in labels, labels
            assert SIBLING in labels and other_farm in labels
            [unnamed] = [b for b in seen if not b.named]
            assert (
                unnamed.label.startswith("unnamed build (")
                and unnamed.estimated_by == "the default"
            )
            record_property(
                "seen_after_start_s", round(found_at - max(b.started_s for b in seen), 2)
            )

            def all_ended() -> bool:
                watch.refresh(fleet, time.time())
                return watch.builds(fleet, cost, time.time()) == []

            wait_until(all_ended, "the foreign builds to end", 90.0, poll_s=0.3)
        finally:
            watch.close()


@pytest.mark.real
def test_a_worker_waits_out_a_foreign_build_that_started_after_placement(
    builders: Builders,
    hand_builds: Callable[..., subprocess.Popen],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _env_of(monkeypatch, builders)
    fleet = _fleet(tmp_path)
    said: list[str] = []

    class Log:
        def info(self, text: str, *args: object) -> None:
            said.append(text % args)

        warning = info

    with instance_for_test() as instance:
        run = dg.DagsterRun(job_name="__ASSET_JOB", run_id=str(uuid.uuid4()))
        instance.add_run(run)
        context = SimpleNamespace(instance=instance, run=run, log=Log())
        hand = hand_builds(E2E_BUILDER, 8)
        watch = ForeignWatch(instance, every_s=0.5, default_s=1800.0)
        wait_until(
            lambda: watch.read_node(fleet.nodes[0], fleet, CostModel(fleet)) != [],
            "the foreign build to run", 60.0, poll_s=0.2,
        )  # fmt: skip
        authority.clear_of_foreign_builds(context, fleet.nodes[0], fleet)
        # It returned because the foreign build ended: BuildKit shows it no more as running.
        assert hand.wait(timeout=30) == 0
        assert watch.read_node(fleet.nodes[0], fleet, CostModel(fleet)) == []
    assert len(said) == 2, said
    assert "(not this farm's)" in said[0] and "stays claimed for this run" in said[0]
    assert said[1].startswith("the build that is not this farm's on demo-big has ended after")


@pytest.mark.real
def test_plan_probe_plans_around_what_a_node_is_building(
    builders: Builders,
    hand_builds: Callable[..., subprocess.Popen],
    tmp_path: Path,
) -> None:
    fleet_file = write_fleet(
        tmp_path / "fleet.yaml",
        [{"name": "held", "builder": E2E_BUILDER, "cores": 32, "mem_gb": 122, "link_mbps": 1000},
         {"name": "idle", "builder": "nobody", "cores": 32, "mem_gb": 122, "link_mbps": 1000}],
    )  # fmt: skip
    hand_builds(E2E_BUILDER, 30, SIBLING)
    env = {**builders.env}
    wait_until(
        lambda: any(r.status == "Running" for r in builders.history(E2E_BUILDER, SIBLING)),
        "the sibling's build to run", 60.0, poll_s=0.2,
    )  # fmt: skip
    done = rocm_assets_cli(
        "plan", "--probe", "--fleet", str(fleet_file), "--targets", "rocm-runtime",
        "--strategy", "default", "--json", "--gantt", str(tmp_path / "plan.svg"), env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    [held] = data["held"]
    assert (held["node"], held["name"], held["estimated_by"]) == ("held", SIBLING, "the default")
    # The only build goes to the node that is free now.
    assert [b["node"] for b in data["builds"]] == ["idle"]
    # The other builder does not exist: said once on stderr, planned as idle.
    assert "idle: its BuildKit history cannot be read, planned as idle" in done.stderr
    assert (
        "unnamed" not in (tmp_path / "plan.svg").read_text()
        and SIBLING in (tmp_path / "plan.svg").read_text()
    )


@pytest.mark.real
def test_an_unreadable_history_is_said_once_and_placed_on_as_before(
    tmp_path: Path,
    dockerd: Dockerd,
    old_buildx: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # buildx 0.13 has no `buildx history`: the builder answers nothing the watch can read.
    old = make_builders(tmp_path / "old-config", {"old": dockerd}, buildx=old_buildx)
    _env_of(monkeypatch, old)
    fleet_file = write_fleet(
        tmp_path / "fleet.yaml",
        [{"name": "old", "builder": "old", "cores": 32, "mem_gb": 122, "link_mbps": 1000}],
    )
    overrides = coordinator_config(fleet_file, foreign_check_seconds=0.2)
    with instance_for_test(overrides=overrides) as instance, caplog.at_level(logging.INFO):
        first = submit(instance, "rocm-runtime", "gfx942")
        second = submit(instance, "pytorch-base", "gfx942")

        def told() -> bool:
            iterate(instance)
            return "not this farm's are not seen" in messages(instance, second.run_id)

        wait_until(told, "the waiting run told of the unreadable history", 60.0, poll_s=0.3)
        for _ in range(3):
            iterate(instance)
            time.sleep(0.3)
        # Placed as before: the first build runs on the only node, the second waits for it.
        assert instance.get_run_by_id(first.run_id).tags.get("rocm/node") == "old"
        waiting = instance.get_run_by_id(second.run_id).tags[ROCM_WAITING_FOR_TAG]
        assert "not this farm's" not in waiting
        note = [e for e in instance.all_logs(second.run_id) if "are not seen" in (e.message or "")]
        assert len(note) == 1 and "has no `buildx history`" in note[0].message
    warned = [
        r for r in caplog.records if "cannot read builder old's BuildKit history" in r.message
    ]
    assert len(warned) == 1, [r.message for r in warned]


@pytest.mark.real
def test_the_first_tick_of_a_request_waits_for_a_node_a_foreign_build_holds(
    builders: Builders,
    hand_builds: Callable[..., subprocess.Popen],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _env_of(monkeypatch, builders)
    fleet_file = write_fleet(
        tmp_path / "fleet.yaml",
        [{"name": "demo-big", "builder": E2E_BUILDER, "cores": 32, "mem_gb": 122, "link_mbps": 1000}],
    )  # fmt: skip
    hand_builds(E2E_BUILDER, 20, SIBLING)
    wait_until(
        lambda: any(r.status == "Running" for r in builders.history(E2E_BUILDER, SIBLING)),
        "the sibling's build to run", 60.0, poll_s=0.2,
    )  # fmt: skip
    overrides = coordinator_config(fleet_file, foreign_check_seconds=2.0)
    with instance_for_test(overrides=overrides) as instance:
        run = submit(instance, "rocm-runtime", "gfx942")
        # The daemon ticks only while runs are queued: its first tick has read no history yet.
        iterate(instance)
        tags = instance.get_run_by_id(run.run_id).tags
        assert tags.get("rocm/node", "") == "", tags
        assert (
            f"demo-big is building {SIBLING} (not this farm's), running"
            in tags[ROCM_WAITING_FOR_TAG]
        )
