# The docker buildx plugin from Debian's docker-buildx, as /buildx (the layout of the official
# docker/buildx-bin image). deploy/base-images.sh exports /buildx and /version from here and imports
# /buildx as an image of its own. The suite is Debian testing by default: Debian 13's buildx 0.13
# cannot name history records (BUILDKIT_BUILD_NAME, buildx >= 0.27), which the builds rely on.
ARG DEBIAN_IMAGE=rocm-local/debian:bookworm
FROM ${DEBIAN_IMAGE} AS fetch
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG SUITE=forky
ARG MIN_VERSION=0.27

# The suite only for this one download, from the image's own mirror: nothing is installed from it.
# hadolint ignore=DL3003
RUN set -eu; \
    mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)"; \
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' \
        "$mirror" "$SUITE" /usr/share/keyrings/debian-archive-keyring.gpg \
        > /etc/apt/sources.list.d/buildx-suite.sources; \
    apt-get update; \
    mkdir -p /tmp/deb /out; \
    cd /tmp/deb; \
    apt-get download "docker-buildx/$SUITE"; \
    dpkg-deb -x docker-buildx_*.deb /tmp/deb/root; \
    version="$(dpkg-deb -f docker-buildx_*.deb Version | sed -e 's/^[0-9]*://' -e 's/[+~-].*//')"; \
    if dpkg --compare-versions "$version" lt "$MIN_VERSION"; then \
        echo "docker-buildx in $SUITE is $version; the farm needs $MIN_VERSION or later" >&2; \
        exit 1; \
    fi; \
    install -m 0755 /tmp/deb/root/usr/libexec/docker/cli-plugins/docker-buildx /out/buildx; \
    /out/buildx version; \
    printf '%s' "$version" > /out/version; \
    rm -rf /tmp/deb /var/lib/apt/lists/* /etc/apt/sources.list.d/buildx-suite.sources

FROM scratch
COPY --from=fetch /out/ /
