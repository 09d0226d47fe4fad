"""The PostgreSQL fixture serves a Dagster instance's storage.

Real parts: PostgreSQL 15 started by rocm_assets_tests/servers/postgres.py, dagster-postgres's
run, event log and schedule storages creating their tables in a fresh database, and the run and
its events written and read back through them.
"""

from typing import Any

import dagster as dg
import psycopg2
import pytest
import sqlalchemy
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.test_utils import create_run_for_test, instance_for_test

from rocm_assets.instance.postgres import ping_on_checkout
from rocm_assets_tests.servers.postgres import PostgresServer


@pytest.mark.real
def test_server_is_postgres_15(postgres_server: PostgresServer) -> None:
    """Real PostgreSQL 15 on loopback TCP, as the postgres superuser."""
    with psycopg2.connect(postgres_server.dsn()) as conn, conn.cursor() as cursor:
        cursor.execute("SHOW server_version_num")
        (version,) = cursor.fetchone()
        cursor.execute("SELECT inet_server_addr()::text")
        (address,) = cursor.fetchone()
    conn.close()
    assert int(version) // 10000 == 15
    assert address.startswith("127.0.0.1")


@pytest.mark.real
def test_dagster_instance_on_postgres(postgres_db: str) -> None:
    """Real PostgreSQL 15 database per test; real dagster-postgres storages on it."""
    overrides = {"storage": {"postgres": {"postgres_url": postgres_db}}}
    with instance_for_test(overrides=overrides) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        run = create_run_for_test(instance, job_name="pg_job", tags={"rocm/test": "yes"})
        instance.report_dagster_event(
            DagsterEvent(DagsterEventType.RUN_START.value, job_name="pg_job", message="start"),
            run_id=run.run_id,
        )
        instance.report_dagster_event(
            DagsterEvent(DagsterEventType.RUN_SUCCESS.value, job_name="pg_job", message="done"),
            run_id=run.run_id,
        )

    # A second instance on the same URL reads it back: the data lives in PostgreSQL.
    with instance_for_test(overrides=overrides) as instance:
        read = instance.get_run_by_id(run.run_id)
        assert read is not None
        assert read.job_name == "pg_job"
        assert read.tags["rocm/test"] == "yes"
        assert read.status == dg.DagsterRunStatus.SUCCESS
        records = instance.get_records_for_run(run.run_id).records
        kinds = [r.event_log_entry.dagster_event_type for r in records]
        assert DagsterEventType.RUN_SUCCESS in kinds


def _end_connections(server: PostgresServer, database_url: str) -> int:
    """What a PostgreSQL restart does to a client's open connections: the server ends them."""
    name = database_url.rsplit("/", 1)[-1]
    with psycopg2.connect(server.dsn()) as conn, conn.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        (ended,) = cursor.fetchone()
    conn.close()
    return ended


@pytest.mark.real
@pytest.mark.parametrize("storage", ["postgres", "farm"])
def test_webserver_connections_survive_postgres_ending_them(
    postgres_server: PostgresServer, postgres_db: str, storage: str
) -> None:
    """Real PostgreSQL 15 ends the pooled connections of an instance optimized as the webserver
    optimizes its own. dagster-postgres's storage fails the next query on each storage; the
    farm's (deploy/dagster.yaml) replaces the dead connection and answers."""
    config = {"postgres_url": postgres_db}
    overrides: dict[str, Any] = (
        {"storage": {"postgres": config}}
        if storage == "postgres"
        else {
            "storage": {
                "custom": {
                    "module": "rocm_assets.instance.postgres",
                    "class": "PostgresStorage",
                    "config": config,
                }
            }
        }
    )
    # The ping is a process-wide pool listener: the control runs without it.
    listening = sqlalchemy.event.contains(sqlalchemy.pool.QueuePool, "checkout", ping_on_checkout)
    if storage == "postgres" and listening:
        sqlalchemy.event.remove(sqlalchemy.pool.QueuePool, "checkout", ping_on_checkout)
    try:
        with instance_for_test(overrides=overrides) as instance:
            expected = "DagsterPostgresStorage" if storage == "postgres" else "PostgresStorage"
            assert instance.get_ref().storage_data.class_name == expected
            instance.optimize_for_webserver(
                statement_timeout=5000, pool_recycle=3600, max_overflow=20
            )
            run = create_run_for_test(instance, job_name="pg_job")
            # Each storage's pooled connection is open now.
            assert [r.run_id for r in instance.get_runs()] == [run.run_id]
            assert instance.get_records_for_run(run.run_id).records == []
            assert _end_connections(postgres_server, postgres_db) >= 2

            if storage == "postgres":
                with pytest.raises(sqlalchemy.exc.OperationalError, match="server closed"):
                    instance.get_runs()
                with pytest.raises(sqlalchemy.exc.OperationalError, match="server closed"):
                    instance.get_records_for_run(run.run_id)
            else:
                assert type(instance.run_storage).__name__ == "PostgresRunStorage"
                assert [r.run_id for r in instance.get_runs()] == [run.run_id]
                assert instance.get_records_for_run(run.run_id).records == []
    finally:
        if listening and not sqlalchemy.event.contains(
            sqlalchemy.pool.QueuePool, "checkout", ping_on_checkout
        ):
            sqlalchemy.event.listen(sqlalchemy.pool.QueuePool, "checkout", ping_on_checkout)
