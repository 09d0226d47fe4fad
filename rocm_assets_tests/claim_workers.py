"""Claimer processes for test_claims: each opens the instance from its DAGSTER_HOME, as a daemon,
webserver or CLI process would, and claims when a shared barrier lets all claimers go at once.

Kept apart from the test module so a spawned process imports only Dagster and the claims module.
"""

import re
import threading
import time
from multiprocessing.queues import Queue
from typing import Any

import dagster as dg
import sqlalchemy as sa

from rocm_assets.instance.claims import claim_builder, holder

# (round, worker, won, error): won is None when the claim raised; error is one line.
Result = tuple[int, int, bool | None, str | None]
_BARRIER_TIMEOUT_S = 60.0


def _error(exc: BaseException) -> str:
    first_line = next(iter(str(exc).strip().splitlines()), "")
    return f"{type(exc).__name__}: {first_line}"


def claim_rounds(
    home: str, rounds: int, worker: int, barrier: threading.Barrier, results: "Queue[Result]"
) -> None:
    """Claim builder `b<round>` for run `r<round>-w<worker>` each round, all workers at once."""
    try:
        instance = dg.DagsterInstance.from_config(home)
        # Open the storage before the first round so no worker starts late.
        holder(instance, "warm-up")
    except Exception as exc:
        results.put((-1, worker, None, _error(exc)))
        barrier.abort()
        return
    with instance:
        for round_ in range(rounds):
            try:
                barrier.wait(timeout=_BARRIER_TIMEOUT_S)
                won = claim_builder(instance, f"b{round_}", f"r{round_}-w{worker}")
            except Exception as exc:
                results.put((round_, worker, None, _error(exc)))
                barrier.abort()
                return
            results.put((round_, worker, won, None))


def lockstep_claim(
    home: str,
    claimer: str,
    target: str,
    run_id: str,
    gate: str,
    stagger_s: float,
    barrier: threading.Barrier,
    results: "Queue[tuple[str, Any]]",
) -> None:
    """Claim `target` while every SQL statement matching `gate` waits for the other claimers,
    then `stagger_s` times its place at the barrier, so those statements run one after another
    (a stagger of 0 sends all claimers into them at the same moment).

    claimer "dagster": Dagster's claim_concurrency_slot on pool `target`; result its slot status.
    claimer "ours": claim_builder on builder `target`; result True/False.
    """
    try:
        instance = dg.DagsterInstance.from_config(home)
        storage = instance.event_log_storage
        # Warm up outside the gate: table checks and engine set-up run once per process.
        storage.get_concurrency_info(target)
        holder(instance, target)
        pattern = re.compile(gate)

        def wait_for_peer(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if pattern.search(statement):
                position = barrier.wait(timeout=_BARRIER_TIMEOUT_S)
                time.sleep(position * stagger_s)

        sa.event.listen(sa.engine.Engine, "before_cursor_execute", wait_for_peer)
        with instance:
            if claimer == "dagster":
                status = storage.claim_concurrency_slot(target, run_id, "step")
                results.put((run_id, status.slot_status.value))
            else:
                results.put((run_id, claim_builder(instance, target, run_id)))
    except Exception as exc:
        barrier.abort()
        results.put((run_id, _error(exc)))
