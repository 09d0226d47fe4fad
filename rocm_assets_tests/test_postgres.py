"""The PostgreSQL fixture serves a Dagster instance's storage.

Real parts: PostgreSQL 15 started by rocm_assets_tests/servers/postgres.py, dagster-postgres's
run, event log and schedule storages creating their tables in a fresh database, and the run and
its events written and read back through them.
"""

import dagster as dg
import psycopg2
import pytest
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.test_utils import create_run_for_test, instance_for_test

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
