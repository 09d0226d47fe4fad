"""The farm's PostgreSQL storage: dagster-postgres's, with pooled connections tested before use.

dagster-webserver keeps one pooled connection per storage (runs, event log, schedules) and never
tests it. After PostgreSQL restarts, the next query on each of them fails with "server closed the
connection unexpectedly", and the UI shows it as a Python error: a launch, a run page, a
materialization list, once each. Here a pooled connection is pinged when it is taken from the pool,
and a dead one is replaced before the query runs (SQLAlchemy's pessimistic disconnect handling).
The daemon, the code server and run workers hold no pool (each query opens its own connection),
so nothing changes for them.

deploy/dagster.yaml selects it with `storage: custom:`; its config is `storage: postgres:`'s.
"""

import contextlib
from collections.abc import Mapping
from typing import Any

import sqlalchemy
from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config


def ping_on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """Raise DisconnectionError for a dead connection: the pool then opens a fresh one."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT 1")
    except Exception as exc:  # the driver's own error types, whichever driver
        raise sqlalchemy.exc.DisconnectionError(str(exc).strip()) from exc
    finally:
        # Closing a cursor of a dead connection may fail too.
        with contextlib.suppress(Exception):
            cursor.close()


def ping_pooled_connections() -> None:
    """Test every queue-pooled connection of this process on checkout (once per process)."""
    pool = sqlalchemy.pool.QueuePool
    if not sqlalchemy.event.contains(pool, "checkout", ping_on_checkout):
        sqlalchemy.event.listen(pool, "checkout", ping_on_checkout)


class PostgresStorage(DagsterPostgresStorage):
    """DagsterPostgresStorage whose webserver survives a PostgreSQL restart without errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        ping_pooled_connections()

    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: Any, config_value: Mapping[str, Any]
    ) -> "PostgresStorage":
        # The parent's builds a DagsterPostgresStorage by name, not cls.
        return cls(
            inst_data=inst_data,
            postgres_url=pg_url_from_config(config_value),
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            token_provider=get_token_provider_from_config(config_value),
        )
