#!/bin/sh
# The local PostgreSQL image's entrypoint (postgres.Dockerfile): on the first start, a cluster in
# PGDATA whose superuser is POSTGRES_USER with POSTGRES_PASSWORD (scram-sha-256 over TCP, trust on
# the container's own socket), and the database POSTGRES_DB; then the command. No value is printed.
set -eu

if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
        POSTGRES_PASSWORD="$(cat "$POSTGRES_PASSWORD_FILE")"
    fi
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "postgres: POSTGRES_PASSWORD is empty: set it (or POSTGRES_PASSWORD_FILE) for the first start" >&2
        exit 1
    fi
    user="${POSTGRES_USER:-postgres}"
    db="${POSTGRES_DB:-$user}"
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
    printf 'host all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
    if [ "$db" != postgres ]; then
        # Listening on the socket alone while the database is made.
        pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
        printf 'CREATE DATABASE :"db";\n' \
            | psql --quiet --no-psqlrc --username="$user" --dbname=postgres -v ON_ERROR_STOP=1 -v db="$db"
        pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    fi
    echo "postgres: made the cluster in $PGDATA: superuser $user, database $db"
fi

exec "$@"
