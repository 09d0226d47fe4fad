# Python 3.11 on Debian bookworm from Debian's own packages: the stand-in for the official
# python:3.11-slim-bookworm on a host that cannot pull it (deploy/base-images.sh builds it).
# Debian's python3 refuses pip installs of its own (PEP 668), so the interpreter the farm image
# installs into is a virtualenv, first on PATH as `python` and `pip`, as /usr/local is there.
ARG DEBIAN_IMAGE=rocm-local/debian:bookworm
FROM ${DEBIAN_IMAGE}

RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/python

ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
# Fails the build unless `python` is 3.11 and its pip runs.
RUN python -c "import sys; assert sys.version_info[:2] == (3, 11), sys.version" \
    && pip --version
CMD ["python"]
