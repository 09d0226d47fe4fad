"""Issue 29, fault 6: the stored plan replaced with garbage, or with JSON of the wrong shape.

The daemon keeps the plan it follows in the instance's key-value store (`rocm/plan`) for
`rocm-assets watch`. Anyone with the instance can overwrite it, and another version may write
another shape. What must hold: `watch` says the plan is unreadable and still shows the nodes and
the queue; the daemon says so in one log line (no traceback), once, makes the plan again and
stores it over the bad one, and places as before.

Real: a SQLite Dagster instance with rocm-assets' coordinator over the shipped rocm-bake.hcl and a
three-node fleet, the queued-run daemon's own iteration, and `rocm-assets watch --once` in a
fresh interpreter on the same instance. Dagster's MockedRunLauncher records launches.
"""

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.test_utils import instance_for_test

from rocm_assets.core.common.constants import PLACEMENT_WAITING, ROCM_PLACEMENT_TAG
from rocm_assets.instance.stored_plan import PLAN_KEY, read_plan
from rocm_assets_tests.helpers import PROJECT_ROOT
from rocm_assets_tests.helpers.instance import coordinator_config, iterate, submit

logger = logging.getLogger(__name__)
# More builds than nodes: some wait, so the plan has queues.
BUILDS = (
    ("rocm-runtime", "gfx942"),
    ("rocm-runtime", "gfx950"),
    ("rocm-runtime", "gfx1100"),
    ("rocm-runtime", "gfx1201"),
    ("pytorch-base", "gfx942"),
)
_GOOD = {
    "strategy": "default(peft)",
    "generation": 3,
    "made_at": 1.0,
    "expected_finish": 2.0,
    "reason": "first plan",
    "solver": "off",
    "queues": {"big": [["rocm-runtime@gfx950", 1.0, 2.0]]},
}
BAD_PLANS = {
    "garbage": ("\x00{ not a plan", "not JSON (Expecting value: line 1 column 1 (char 0))"),
    "a list": ("[1, 2, 3]", "a JSON list, not an object"),
    "a field of the wrong type": (
        json.dumps({**_GOOD, "expected_finish": "soon"}),
        "'expected_finish' is 'soon', not a number",
    ),
    "a queue that is no list": (
        json.dumps({**_GOOD, "queues": {"big": 5}}),
        "queue of 'big' is not a list of [build, start, finish]",
    ),
    "a missing field": (
        json.dumps({k: v for k, v in _GOOD.items() if k != "queues"}),
        "'queues' is None, not an object",
    ),
}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "dagster_home"
    path.mkdir()
    return path


@pytest.fixture
def farm(home: Path, fleet_file: Path) -> Iterator[dg.DagsterInstance]:
    """The instance with BUILDS submitted and placed as far as the nodes go: a plan stored."""
    overrides = coordinator_config(fleet_file, solver=False)
    with instance_for_test(temp_dir=str(home), overrides=overrides) as instance:
        for target, arch in BUILDS:
            submit(instance, target, arch)
        iterate(instance)
        yield instance


def stored(instance: dg.DagsterInstance) -> str:
    return instance.run_storage.get_cursor_values({PLAN_KEY})[PLAN_KEY]


def watch_once(home: Path, fleet_file: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(home),
        ROCM_FLEET_FILE=str(fleet_file),
        PYTHONPATH=os.pathsep.join(p for p in [str(PROJECT_ROOT), env.get("PYTHONPATH")] if p),
    )
    return subprocess.run(
        [sys.executable, "-m", "rocm_assets.cli", "watch", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_good_plan_reads_back_as_it_was_stored(farm: dg.DagsterInstance) -> None:
    plan = read_plan(stored(farm))
    assert plan["reason"] == "first plan"
    assert plan["queues"], "some builds wait: the plan has queues"


@pytest.mark.parametrize("bad", list(BAD_PLANS), ids=list(BAD_PLANS))
def test_an_unreadable_plan_is_said_by_watch_and_made_again_by_the_daemon(
    farm: dg.DagsterInstance,
    home: Path,
    fleet_file: Path,
    caplog: pytest.LogCaptureFixture,
    bad: str,
) -> None:
    text, why = BAD_PLANS[bad]
    before = read_plan(stored(farm))
    farm.run_storage.set_cursor_values({PLAN_KEY: text})

    # watch: one line says so; the nodes and the queue still show.
    shown = watch_once(home, fleet_file)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == ""
    lines = shown.stdout.splitlines()
    assert f"plan: unreadable ({why}); the daemon stores a new one when it next plans" in lines
    waiting = [r for r in farm.get_runs() if r.tags.get(ROCM_PLACEMENT_TAG) == PLACEMENT_WAITING]
    assert lines[0].startswith("rocm-assets watch") and f"queue ({len(waiting)} waiting):" in lines
    assert waiting

    # The daemon: one warning, no traceback, a new plan over the bad one.
    caplog.set_level(logging.INFO)
    caplog.clear()
    started = time.monotonic()
    iterate(farm)
    logger.info(
        "plan stored again %.2f s after the daemon's iteration began", time.monotonic() - started
    )
    said = [r for r in caplog.records if "stored plan" in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in said] == [
        ("WARNING", f"placement: the stored plan {PLAN_KEY} is unreadable, re-planning: {why}")
    ]
    assert all(r.exc_info is None for r in caplog.records)
    after = read_plan(stored(farm))
    assert after["generation"] == before["generation"] + 1
    assert after["reason"] == f"the stored plan was unreadable: {why}"
    assert after["queues"], "the builds still waiting are planned again"
    # Said once: the next iterations find the plan it stored.
    caplog.clear()
    iterate(farm)
    assert not [r for r in caplog.records if "stored plan" in r.getMessage()]
    assert read_plan(stored(farm))["generation"] == after["generation"]

    again = watch_once(home, fleet_file)
    assert again.returncode == 0, again.stderr
    assert not [line for line in again.stdout.splitlines() if line.startswith("plan: unreadable")]
    assert any(line.startswith("plan (") for line in again.stdout.splitlines())
