"""Builder claims: a build holds its builder (machine) from placement until its run ends.

Each builder is a Dagster pool `rocm-builder/<builder>` with one slot, a row of the instance's
`concurrency_slots` table. A run holds the builder while that row carries its run id. The claim
lives in the instance's own storage (SQLite or PostgreSQL), so the webserver, the daemon and the
CLI all see one truth, the UI's pool pages show who holds each machine, and Dagster frees a claim
by run id like its own slots (`free_concurrency_slots_for_run`, run deletion, the run-monitoring
daemon's `free_slots_after_run_end_seconds`).

Why not Dagster's `claim_concurrency_slot`: it is not atomic across processes. It checks for a
free slot, inserts an assigned pending step, reads a free slot id and updates that id, each step
a separate statement with no `step_key IS NULL` guard on the final UPDATE. SQLite ignores
`FOR UPDATE SKIP LOCKED` and dagster-postgres runs in autocommit, so the row lock ends with the
SELECT. Two processes can both see the slot free and both get CLAIMED; the table keeps only the
last writer (rocm_assets_tests/test_claims.py shows it). Our claim is one conditional UPDATE.

Builder pools are for these claims only: no op should name one as its pool.
"""

from collections.abc import Iterable

import dagster as dg
import sqlalchemy as sa

from rocm_assets.instance.dagster_internals import (
    ConcurrencySlotsTable,
    PendingStepsTable,
    SqlEventLogStorage,
)

BUILDER_POOL_PREFIX = "rocm-builder/"
# The step key a claim writes: Dagster treats a slot with a step key as taken, and tells our
# claims apart from op slots by it. Short: MySQL indexes only 32 characters of step keys.
CLAIM_STEP_KEY = "rocm-builder-claim"
# A run in one of these will not use its builder again.
FINISHED_STATUSES = frozenset(
    {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
)

_slots = ConcurrencySlotsTable
_pending = PendingStepsTable


class BuilderClaimError(Exception):
    """The instance cannot hold builder claims, or a builder has no pool."""


def supported(instance: dg.DagsterInstance) -> bool:
    """Whether the instance's storage can hold claims (an ephemeral in-memory one cannot, but
    then no other process shares it either)."""
    storage = instance.event_log_storage
    return isinstance(storage, SqlEventLogStorage) and storage.supports_global_concurrency_limits


def builder_pool(builder: str) -> str:
    return f"{BUILDER_POOL_PREFIX}{builder}"


def _storage(instance: dg.DagsterInstance) -> SqlEventLogStorage:
    storage = instance.event_log_storage
    # SQLite (sharded or consolidated) and PostgreSQL storages are SqlEventLogStorage; a storage
    # migrated before pools existed lacks the slots table.
    if not supported(instance) or not isinstance(storage, SqlEventLogStorage):
        raise BuilderClaimError(
            f"event log storage {type(storage).__name__} has no concurrency slots table "
            "(a SQL storage is needed; run `dagster instance migrate` on an old one)"
        )
    return storage


def ensure_builder_pools(instance: dg.DagsterInstance, builders: Iterable[str]) -> None:
    """Give every builder a one-slot pool; an existing pool keeps its slot and its holder."""
    storage = _storage(instance)
    for builder in builders:
        # Setting a one-slot pool to one slot changes no row: a held slot stays held.
        storage.set_concurrency_slots(builder_pool(builder), 1)


def claim_builder(instance: dg.DagsterInstance, builder: str, run_id: str) -> bool:
    """Atomically take `builder` for `run_id`: True if the run holds it now (or already did)."""
    storage = _storage(instance)
    pool = builder_pool(builder)
    free_slot = (
        sa.select(_slots.c.id)
        .where(
            _slots.c.concurrency_key == pool,
            _slots.c.step_key.is_(None),
            _slots.c.deleted == sa.false(),
        )
        .limit(1)
        .scalar_subquery()
    )
    # One statement: SQLite takes its write lock before reading, and PostgreSQL re-checks
    # `step_key IS NULL` on the row after a concurrent winner commits, so one claimer wins.
    claim = (
        _slots.update()
        .where(_slots.c.id == free_slot, _slots.c.step_key.is_(None))
        .values(run_id=run_id, step_key=CLAIM_STEP_KEY)
    )
    with storage.index_transaction() as conn:
        if conn.execute(claim).rowcount == 1:
            # The run-monitoring daemon finds runs to free through pending steps only; an
            # assigned one lets it free a finished run's claim as it frees op slots.
            conn.execute(
                _pending.insert().values(
                    concurrency_key=pool,
                    run_id=run_id,
                    step_key=CLAIM_STEP_KEY,
                    priority=0,
                    assigned_timestamp=sa.func.now(),
                )
            )
            return True
        rows = conn.execute(
            sa.select(_slots.c.run_id, _slots.c.deleted).where(_slots.c.concurrency_key == pool)
        ).all()
    if not any(not row.deleted for row in rows):
        raise BuilderClaimError(f"builder {builder!r} has no pool: call ensure_builder_pools")
    return any(row.run_id == run_id for row in rows)


def holder(instance: dg.DagsterInstance, builder: str) -> str | None:
    """The run holding `builder`, or None if it is free."""
    with _storage(instance).index_connection() as conn:
        return conn.execute(
            sa.select(_slots.c.run_id)
            .where(_slots.c.concurrency_key == builder_pool(builder), _slots.c.run_id.is_not(None))
            .limit(1)
        ).scalar()


def claims(instance: dg.DagsterInstance) -> dict[str, str]:
    """Every held builder and the run holding it."""
    with _storage(instance).index_connection() as conn:
        rows = conn.execute(
            sa.select(_slots.c.concurrency_key, _slots.c.run_id).where(
                _slots.c.concurrency_key.startswith(BUILDER_POOL_PREFIX),
                _slots.c.run_id.is_not(None),
            )
        ).all()
    return {row.concurrency_key.removeprefix(BUILDER_POOL_PREFIX): row.run_id for row in rows}


def _release(storage: SqlEventLogStorage, run_id: str, pool: str | None = None) -> int:
    # Only our claims: an op slot the run may hold is Dagster's to free.
    ours = [_slots.c.run_id == run_id, _slots.c.step_key == CLAIM_STEP_KEY]
    theirs = [_pending.c.run_id == run_id, _pending.c.step_key == CLAIM_STEP_KEY]
    if pool is None:
        ours.append(_slots.c.concurrency_key.startswith(BUILDER_POOL_PREFIX))
        theirs.append(_pending.c.concurrency_key.startswith(BUILDER_POOL_PREFIX))
    else:
        ours.append(_slots.c.concurrency_key == pool)
        theirs.append(_pending.c.concurrency_key == pool)
    # One transaction, unlike Dagster's free: a slot is never freed with its pending row left.
    with storage.index_transaction() as conn:
        freed = conn.execute(_slots.update().where(*ours).values(run_id=None, step_key=None))
        conn.execute(_pending.delete().where(*theirs))
        return freed.rowcount


def release_run(instance: dg.DagsterInstance, run_id: str) -> int:
    """Free every builder `run_id` holds, and end its lease; the number freed."""
    freed = _release(_storage(instance), run_id)
    end_lease(instance, run_id)
    return freed


def release_claim(instance: dg.DagsterInstance, builder: str, run_id: str) -> bool:
    """Free `builder` if `run_id` holds it, and end the run's lease; whether it did (a claim
    taken since is left alone)."""
    if _release(_storage(instance), run_id, builder_pool(builder)) > 0:
        end_lease(instance, run_id)
        return True
    return False


def keep_from_dagster(instance: dg.DagsterInstance, run_id: str) -> None:
    """Take `run_id`'s claims out of Dagster's own sweep: their slots stay held, their pending-
    step rows go, so only `release_claim` or `release_run` frees them (the daemon's drain holds a
    builder while the bake of an ended run may still run there: rocm_assets.instance.drain)."""
    with _storage(instance).index_transaction() as conn:
        conn.execute(
            _pending.delete().where(
                _pending.c.run_id == run_id,
                _pending.c.step_key == CLAIM_STEP_KEY,
                _pending.c.concurrency_key.startswith(BUILDER_POOL_PREFIX),
            )
        )


# A run that holds (or waits for) a builder renews its lease in the instance's key-value store
# while its worker lives; the daemon frees the builder of a started run whose lease went stale.
# Run monitoring cannot see an in-process run (`dagster asset materialize`) die.
LEASE_KEY_PREFIX = "rocm/lease/"


def renew_lease(instance: dg.DagsterInstance, run_id: str, now: float) -> None:
    instance.run_storage.set_cursor_values({f"{LEASE_KEY_PREFIX}{run_id}": repr(now)})


def end_lease(instance: dg.DagsterInstance, run_id: str) -> None:
    """The run holds nothing any more: its lease is blanked (the store has no delete), which
    `leases` reads as none."""
    instance.run_storage.set_cursor_values({f"{LEASE_KEY_PREFIX}{run_id}": ""})


def leases(instance: dg.DagsterInstance, run_ids: Iterable[str]) -> dict[str, float]:
    """The last renewal of each run's lease (epoch seconds); runs that never renewed are absent."""
    keys = {f"{LEASE_KEY_PREFIX}{run_id}" for run_id in run_ids}
    if not keys:
        return {}
    found: dict[str, float] = {}
    for key, value in instance.run_storage.get_cursor_values(keys).items():
        try:
            found[key.removeprefix(LEASE_KEY_PREFIX)] = float(value)
        except ValueError:
            continue  # an unreadable lease is no lease
    return found


def builder_of(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """The builder `run_id` holds, or None."""
    return next((b for b, holder_id in claims(instance).items() if holder_id == run_id), None)
