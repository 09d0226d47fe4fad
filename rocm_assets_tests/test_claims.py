"""Builder claims (rocm_assets.instance.claims) on both storages a deployment may use.

Every test runs twice: on a real SQLite instance (instance_for_test in a temp DAGSTER_HOME, so
real SQLite files in WAL mode, which every process opens on its own) and on a real PostgreSQL 15
database (rocm_assets_tests/servers/postgres.py) through dagster-postgres. The race tests use
separate OS processes (multiprocessing, spawn), each opening the instance from the same
DAGSTER_HOME as a daemon, webserver or CLI process would; nothing is mocked.
"""

import logging
import multiprocessing
import queue
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dagster as dg
import pytest
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.remote_origin import (
    RegisteredCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.test_utils import create_run_for_test, instance_for_test
from dagster._daemon.monitoring.concurrency import execute_concurrency_slots_iteration

from rocm_assets.instance.claims import (
    BUILDER_POOL_PREFIX,
    CLAIM_STEP_KEY,
    BuilderClaimError,
    builder_pool,
    claim_builder,
    claims,
    ensure_builder_pools,
    holder,
    leases,
    release_claim,
    release_run,
    renew_lease,
)
from rocm_assets.instance.drain import BakeDrain
from rocm_assets_tests.claim_workers import claim_rounds, lockstep_claim

CLAIMERS = 8
ROUNDS = 20
# Seconds after a run ends before the run-monitoring daemon frees its slots.
FREE_AFTER_S = 1
_PROCESS_TIMEOUT_S = 180.0
ORIGIN = RemoteJobOrigin(
    RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("rocm_assets"), "__repository__"), "build"
)
_SPAWN = multiprocessing.get_context("spawn")
# Lockstep gates: the SQL statements at which each claimer waits for the other.
ANY_SLOTS_STATEMENT = r"\bconcurrency_slots\b"
CLAIM_UPDATE = r"^\s*UPDATE concurrency_slots\b"


@pytest.fixture(params=["sqlite", "postgres"])
def storage_overrides(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "sqlite":
        return {}  # instance_for_test's default: SQLite files in its DAGSTER_HOME
    url = request.getfixturevalue("postgres_db")
    return {"storage": {"postgres": {"postgres_url": url}}}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "dagster_home"


@pytest.fixture
def instance(storage_overrides: dict[str, Any], home: Path) -> Iterator[dg.DagsterInstance]:
    home.mkdir()
    # run_monitoring is read only by the daemon iteration that test_dagster_frees_claims runs.
    overrides = {
        **storage_overrides,
        "run_monitoring": {"enabled": True, "free_slots_after_run_end_seconds": FREE_AFTER_S},
    }
    # instance_for_test writes these into home/dagster.yaml, which the claimer processes read.
    with instance_for_test(overrides=overrides, temp_dir=str(home)) as instance:
        yield instance


def _run_processes(
    target: Callable[..., None], args: list[tuple[Any, ...]], results: Any, count: int
) -> list[Any]:
    """Start one process per args tuple; the results they put (`count` unless one failed and
    the others stopped early), once all have exited."""
    processes = [_SPAWN.Process(target=target, args=a) for a in args]
    for process in processes:
        process.start()
    got: list[Any] = []
    deadline = time.monotonic() + _PROCESS_TIMEOUT_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            try:
                got.append(results.get(timeout=1.0))
            except queue.Empty:
                if not any(p.is_alive() for p in processes):
                    break
    finally:
        for process in processes:
            process.join(timeout=_PROCESS_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join()
    assert [p.exitcode for p in processes] == [0] * len(processes)
    return got


def _finish(instance: dg.DagsterInstance, run: dg.DagsterRun, event: DagsterEventType) -> None:
    # As a run worker does: the events set the run's status, start and end times.
    instance.report_dagster_event(
        DagsterEvent(event.value, job_name=run.job_name, message=event.value), run_id=run.run_id
    )


@pytest.mark.real
def test_one_of_eight_processes_wins_each_round(instance: dg.DagsterInstance, home: Path) -> None:
    """Real SQLite / PostgreSQL 15; 8 real OS processes claim one builder at the same moment
    (a shared barrier), 20 rounds, each round a fresh builder: exactly one wins every round."""
    ensure_builder_pools(instance, [f"b{r}" for r in range(ROUNDS)])
    barrier = _SPAWN.Barrier(CLAIMERS)
    results = _SPAWN.Queue()
    got = _run_processes(
        claim_rounds,
        [(str(home), ROUNDS, w, barrier, results) for w in range(CLAIMERS)],
        results,
        CLAIMERS * ROUNDS,
    )

    errors = [(r, w, e) for r, w, _, e in got if e is not None]
    assert errors == []
    winners = {r: [w for rr, w, won, _ in got if rr == r and won] for r in range(ROUNDS)}
    assert {r: len(ws) for r, ws in winners.items()} == dict.fromkeys(range(ROUNDS), 1)
    assert claims(instance) == {f"b{r}": f"r{r}-w{winners[r][0]}" for r in range(ROUNDS)}


@pytest.mark.real
def test_dagster_claim_concurrency_slot_is_not_atomic(
    instance: dg.DagsterInstance, home: Path
) -> None:
    """Why claims.py has its own claim. Real SQLite / PostgreSQL 15, 2 real OS processes, Dagster's
    own `claim_concurrency_slot` on a one-slot pool. Each statement on concurrency_slots waits
    for the other process, then they run 0.3 s apart: both read the slot free (PostgreSQL's
    SKIP LOCKED row lock is gone with its autocommitted SELECT), both UPDATE it by id with no
    `step_key IS NULL` guard, both are told CLAIMED, and the table keeps only the last writer."""
    storage = instance.event_log_storage
    storage.set_concurrency_slots("one-slot", 1)
    barrier = _SPAWN.Barrier(2)
    results = _SPAWN.Queue()
    args = [
        (str(home), "dagster", "one-slot", run, ANY_SLOTS_STATEMENT, 0.3, barrier, results)
        for run in ("run-a", "run-b")
    ]
    got = dict(_run_processes(lockstep_claim, args, results, 2))

    assert got == {"run-a": "CLAIMED", "run-b": "CLAIMED"}
    held = storage.get_concurrency_info("one-slot").claimed_slots
    assert len(held) == 1
    assert held[0].run_id in got


@pytest.mark.real
def test_claim_builder_in_lockstep(instance: dg.DagsterInstance, home: Path) -> None:
    """Real SQLite / PostgreSQL 15, 2 real OS processes sent into claim_builder's UPDATE at the
    same moment by the harness that breaks Dagster's claim: exactly one holds the builder."""
    ensure_builder_pools(instance, ["gfx942-node"])
    barrier = _SPAWN.Barrier(2)
    results = _SPAWN.Queue()
    args = [
        (str(home), "ours", "gfx942-node", run, CLAIM_UPDATE, 0.0, barrier, results)
        for run in ("run-a", "run-b")
    ]
    got = dict(_run_processes(lockstep_claim, args, results, 2))

    assert sorted(got.values()) == [False, True]
    winner = next(run for run, won in got.items() if won)
    assert holder(instance, "gfx942-node") == winner


@pytest.mark.real
def test_claim_builder(instance: dg.DagsterInstance) -> None:
    """Real SQLite / PostgreSQL 15 instance, one process: the claim's answers and its rows."""
    ensure_builder_pools(instance, ["a", "b"])
    assert claim_builder(instance, "a", "run-1")
    assert claim_builder(instance, "a", "run-1"), "a run holding the builder holds it still"
    assert not claim_builder(instance, "a", "run-2")
    assert holder(instance, "a") == "run-1"
    assert holder(instance, "b") is None
    assert claims(instance) == {"a": "run-1"}

    # Dagster sees the claim as a held slot plus an assigned pending step of the run.
    info = instance.event_log_storage.get_concurrency_info(builder_pool("a"))
    assert [(s.run_id, s.step_key) for s in info.claimed_slots] == [("run-1", CLAIM_STEP_KEY)]
    assert [(p.run_id, p.assigned_timestamp is not None) for p in info.pending_steps] == [
        ("run-1", True)
    ]

    with pytest.raises(BuilderClaimError, match="no pool"):
        claim_builder(instance, "unknown", "run-1")


@pytest.mark.real
def test_ensure_builder_pools_keeps_claims(instance: dg.DagsterInstance) -> None:
    """Real SQLite / PostgreSQL 15 instance: re-ensuring pools resets no claim, adds no slot."""
    ensure_builder_pools(instance, ["a"])
    assert claim_builder(instance, "a", "run-1")
    ensure_builder_pools(instance, ["a", "b"])
    ensure_builder_pools(instance, ["a", "b"])

    assert claims(instance) == {"a": "run-1"}
    assert not claim_builder(instance, "a", "run-2")
    assert claim_builder(instance, "b", "run-2")
    storage = instance.event_log_storage
    for builder in ("a", "b"):
        info = storage.get_concurrency_info(builder_pool(builder))
        assert (info.slot_count, info.limit) == (1, 1)
    assert storage.get_concurrency_keys() == {builder_pool("a"), builder_pool("b")}


@pytest.mark.real
def test_release_run(instance: dg.DagsterInstance) -> None:
    """Real SQLite / PostgreSQL 15 instance: a run's builders are freed, others' stay, and an op
    slot the run holds through Dagster's own pools is left to Dagster."""
    ensure_builder_pools(instance, ["a", "b", "c"])
    storage = instance.event_log_storage
    storage.set_concurrency_slots("op-pool", 1)
    assert storage.claim_concurrency_slot("op-pool", "run-1", "compile").is_claimed
    for builder, run in (("a", "run-1"), ("b", "run-1"), ("c", "run-2")):
        assert claim_builder(instance, builder, run)
        renew_lease(instance, run, 1000.0)

    assert release_run(instance, "run-1") == 2
    assert claims(instance) == {"c": "run-2"}
    # Its lease ends with its claims; the other run's stands.
    assert leases(instance, ["run-1", "run-2"]) == {"run-2": 1000.0}
    assert release_run(instance, "run-1") == 0
    for builder in ("a", "b"):
        assert storage.get_concurrency_info(builder_pool(builder)).pending_steps == []
    op_slots = storage.get_concurrency_info("op-pool").claimed_slots
    assert [(s.run_id, s.step_key) for s in op_slots] == [("run-1", "compile")]

    assert claim_builder(instance, "a", "run-3"), "a freed builder can be claimed again"


@pytest.mark.real
def test_the_daemon_frees_the_claims_of_runs_that_never_baked(instance: dg.DagsterInstance) -> None:
    """Real SQLite / PostgreSQL 15 instance with real run records in each status: the daemon's
    sweep (rocm_assets.instance.drain) frees the claims of finished (SUCCESS, FAILURE, CANCELED)
    runs whose worker never started, so never baked, and of missing runs at once; the rest stay."""
    statuses = {
        "done": dg.DagsterRunStatus.SUCCESS,
        "failed": dg.DagsterRunStatus.FAILURE,
        "canceled": dg.DagsterRunStatus.CANCELED,
        "running": dg.DagsterRunStatus.STARTED,
        "starting": dg.DagsterRunStatus.STARTING,
        "queued": dg.DagsterRunStatus.QUEUED,
    }
    run_ids = {
        # Dagster stores a queued run only with the origin the queue daemon would launch it from.
        b: create_run_for_test(instance, status=s, remote_job_origin=ORIGIN).run_id
        for b, s in statuses.items()
    }
    run_ids["gone"] = str(uuid.uuid4())  # never stored, as after `dagster run delete`
    ensure_builder_pools(instance, run_ids)
    for builder, run_id in run_ids.items():
        assert claim_builder(instance, builder, run_id)
        renew_lease(instance, run_id, 1000.0)

    drain = BakeDrain(instance, wait_s=3600)
    drain.sweep(time.time())

    assert claims(instance) == {b: run_ids[b] for b in ("running", "starting", "queued")}
    assert drain.draining() == {}
    assert leases(instance, run_ids.values()) == {
        run_ids[b]: 1000.0 for b in ("running", "starting", "queued")
    }
    assert not release_claim(instance, "done", run_ids["done"])
    assert not release_claim(instance, "running", run_ids["queued"])
    assert release_claim(instance, "running", run_ids["running"])


@pytest.mark.real
def test_dagster_frees_claims(instance: dg.DagsterInstance) -> None:
    """Real SQLite / PostgreSQL 15 instance, Dagster's own code paths: free_concurrency_slots_for_run,
    run deletion, and one iteration of the run-monitoring daemon's slot freeing (the function
    `dagster-daemon` runs) after free_slots_after_run_end_seconds, with real run events."""
    ensure_builder_pools(instance, ["a", "b", "c", "d"])
    runs = {b: create_run_for_test(instance, job_name="build") for b in ("a", "b", "c", "d")}
    for builder, run in runs.items():
        assert claim_builder(instance, builder, run.run_id)
    storage = instance.event_log_storage

    storage.free_concurrency_slots_for_run(runs["a"].run_id)
    assert holder(instance, "a") is None
    assert storage.get_concurrency_info(builder_pool("a")).pending_steps == []

    instance.delete_run(runs["b"].run_id)
    assert holder(instance, "b") is None

    for run in (runs["c"], runs["d"]):
        _finish(instance, run, DagsterEventType.RUN_START)
    _finish(instance, runs["c"], DagsterEventType.RUN_SUCCESS)
    context = SimpleNamespace(instance=instance)
    logger = logging.getLogger(__name__)
    list(execute_concurrency_slots_iteration(context, logger))  # type: ignore[arg-type]
    assert holder(instance, "c") == runs["c"].run_id, "freed before the configured delay"

    time.sleep(FREE_AFTER_S + 0.5)
    list(execute_concurrency_slots_iteration(context, logger))  # type: ignore[arg-type]
    assert claims(instance) == {"d": runs["d"].run_id}


def test_builder_pool_names() -> None:
    """Pure: the pool name a builder's claim lives under."""
    assert builder_pool("gfx942-node") == f"{BUILDER_POOL_PREFIX}gfx942-node"
    assert BUILDER_POOL_PREFIX == "rocm-builder/"
