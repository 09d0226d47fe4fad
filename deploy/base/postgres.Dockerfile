# PostgreSQL from Debian's postgresql (15 on bookworm), with the official postgres image's
# interface: POSTGRES_USER, POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE) and POSTGRES_DB make the
# cluster in PGDATA (/var/lib/postgresql/data) on its first start; pg_isready on PATH for the
# healthcheck. deploy/base-images.sh builds it for a host that cannot pull postgres:16-bookworm.
# A data volume belongs to one major version: one made by this image (15) is not opened by 16.
ARG DEBIAN_IMAGE=rocm-local/debian:bookworm
FROM ${DEBIAN_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# No cluster from the package's own scripts: the entrypoint makes one in PGDATA.
RUN mkdir -p /etc/postgresql-common/createcluster.d \
    && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/rocm-local.conf \
    && apt-get update \
    && apt-get install -y --no-install-recommends postgresql \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -type d | sort -V | tail -n 1)" \
        /usr/lib/postgresql/current \
    && mkdir -p /var/lib/postgresql/data /run/postgresql \
    && chown postgres:postgres /var/lib/postgresql/data /run/postgresql \
    && chmod 0700 /var/lib/postgresql/data

ENV PATH=/usr/lib/postgresql/current/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh

# A new named volume takes the directory's owner from the image: postgres, so no root is needed.
# hadolint ignore=DL3066
USER postgres
VOLUME /var/lib/postgresql/data
EXPOSE 5432
# Fast shutdown: PostgreSQL's smart mode would wait for every client to leave.
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
CMD ["postgres"]
