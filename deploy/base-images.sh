#!/usr/bin/env bash
# Builds the farm's base images from Debian packages, for a Docker host that cannot pull them from
# Docker Hub (deploy/README.md, "Base images without Docker Hub"):
#
#   <prefix>/debian:bookworm        debootstrap --variant=minbase from the Debian mirror, imported
#   <prefix>/python:3.11-bookworm   Debian's python3 (3.11) in a virtualenv on PATH as python, pip
#   <prefix>/buildx-bin:<version>   /buildx, from Debian's docker-buildx (testing: >= 0.27)
#   <prefix>/postgres:15-bookworm   Debian's postgresql, with the official image's settings
#
# and prints the deploy/.env lines that make compose use them. An image that is already there is
# kept (--rebuild makes them again). Needs root (debootstrap), the docker CLI with its buildx plugin,
# and an engine reachable as DOCKER_HOST or the current context says. Builds run with
# `--network host`, so an engine without a default bridge (--bridge=none) builds them too.
#
#   bash deploy/base-images.sh [--rebuild]
#
# Settings (environment): ROCM_BASE_PREFIX (rocm-local), DEBIAN_MIRROR (the machine's own Debian
# source), DEBIAN_SECURITY_MIRROR, ROCM_BUILDX_SUITE (forky: the Debian suite buildx comes from).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
prefix="${ROCM_BASE_PREFIX:-rocm-local}"
suite=bookworm
buildx_suite="${ROCM_BUILDX_SUITE:-forky}"
rebuild=0

die() {
    echo "base-images: $*" >&2
    exit 1
}

for arg in "$@"; do
    case "$arg" in
        --rebuild) rebuild=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown argument $arg (only --rebuild)" ;;
    esac
done

# The URI of the machine's own source for a Debian archive (debian or debian-security), from its
# deb822 or one-line sources; the official one when the machine names none.
source_uri() {
    local archive="$1" fallback="$2" uri=""
    if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
        uri="$(awk -v a="/$archive/?\$" '/^URIs:/ && $2 ~ a {print $2; exit}' \
            /etc/apt/sources.list.d/*.sources)"
    fi
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri="$(awk -v a="/$archive/?\$" '$1 == "deb" && $2 ~ a {print $2; exit}' /etc/apt/sources.list)"
    fi
    echo "${uri:-$fallback}"
}

mirror="${DEBIAN_MIRROR:-$(source_uri debian http://deb.debian.org/debian)}"
security="${DEBIAN_SECURITY_MIRROR:-$(source_uri debian-security http://deb.debian.org/debian-security)}"

command -v docker >/dev/null || die "the docker CLI is not installed (apt-get install docker-cli, or docker.io)"
docker info --format '{{.ServerVersion}}' >/dev/null 2>&1 \
    || die "no Docker engine answers (docker info failed): set DOCKER_HOST or start dockerd"
docker buildx version >/dev/null 2>&1 \
    || die "the docker buildx plugin is missing (apt-get install docker-buildx)"

have() {
    [ "$rebuild" -eq 0 ] && docker image inspect "$1" >/dev/null 2>&1
}

build() {
    # build TAG DOCKERFILE [--build-arg ...]
    local tag="$1" dockerfile="$2"
    shift 2
    echo "base-images: building $tag" >&2
    docker buildx build --load --network host --progress plain \
        --build-arg "DEBIAN_IMAGE=$debian_image" "$@" \
        -t "$tag" -f "$dockerfile" "$here/base" >&2
}

tmp="$(mktemp -d)"
cleanup() {
    rm -rf "$tmp"
}
trap cleanup EXIT

debian_image="$prefix/debian:$suite"
if ! have "$debian_image"; then
    [ "$(id -u)" -eq 0 ] || die "debootstrap needs root: run as root (or import $debian_image yourself)"
    command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
    echo "base-images: debootstrap --variant=minbase $suite from $mirror" >&2
    rootfs="$tmp/rootfs"
    debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >&2
    # The suite's updates and security fixes too, from the same mirrors, as the images apt-get them.
    rm -f "$rootfs/etc/apt/sources.list"
    printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: %s\n\n' \
        "$mirror" "$suite" "$suite" /usr/share/keyrings/debian-archive-keyring.gpg \
        >"$rootfs/etc/apt/sources.list.d/debian.sources"
    printf 'Types: deb\nURIs: %s\nSuites: %s-security\nComponents: main\nSigned-By: %s\n' \
        "$security" "$suite" /usr/share/keyrings/debian-archive-keyring.gpg \
        >>"$rootfs/etc/apt/sources.list.d/debian.sources"
    # A mirror this machine trusts past its Release files' Valid-Until (a snapshot) is trusted so
    # in the images too.
    if apt-config dump Acquire::Check-Valid-Until 2>/dev/null | grep -q '"false"'; then
        echo 'Acquire::Check-Valid-Until "false";' >"$rootfs/etc/apt/apt.conf.d/99check-valid-until"
    fi
    # What an image needs none of: downloaded packages, package lists, logs.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log
    tar --numeric-owner -C "$rootfs" -c . \
        | docker import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$debian_image" >/dev/null
    rm -rf "$rootfs"
fi

python_image="$prefix/python:3.11-$suite"
have "$python_image" || build "$python_image" "$here/base/python.Dockerfile"

postgres_image="$prefix/postgres:15-$suite"
have "$postgres_image" || build "$postgres_image" "$here/base/postgres.Dockerfile"

# buildx is tagged with its own version, which is known once the package is fetched.
buildx_image="$(docker image ls --format '{{.Repository}}:{{.Tag}}' "$prefix/buildx-bin" | head -n 1)"
if [ -z "$buildx_image" ] || [ "$rebuild" -eq 1 ]; then
    echo "base-images: fetching docker-buildx from Debian $buildx_suite" >&2
    docker buildx build --network host --progress plain \
        --build-arg "DEBIAN_IMAGE=$debian_image" --build-arg "SUITE=$buildx_suite" \
        --output "type=local,dest=$tmp/buildx" -f "$here/base/buildx.Dockerfile" "$here/base" >&2
    version="$(cat "$tmp/buildx/version")"
    buildx_image="$prefix/buildx-bin:$version"
    tar --numeric-owner -C "$tmp/buildx" -c buildx | docker import - "$buildx_image" >/dev/null
fi

cat <<ENV
# Base images built from Debian packages; put these lines in deploy/.env:
ROCM_PYTHON_IMAGE=$python_image
ROCM_BUILDX_IMAGE=$buildx_image
ROCM_POSTGRES_IMAGE=$postgres_image
ENV
