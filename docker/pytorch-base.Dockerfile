# syntax=docker/dockerfile:1
# pytorch-base: the build toolchain every compiling target starts from -- compilers and build
# libraries, Python PYTHON_VERSION in /opt/venv, sccache, and the farm's helpers -- on rocm-runtime.
# Takes: RUNTIME_IMAGE (named context "rocm-runtime", or its registry image with PUBLISHED_INPUTS=1).
# Gives: /opt/venv (on PATH; its interpreter under /opt/python) with pip, setuptools, wheel,
#        packaging, ninja, pybind11, Cython, sccache; and in /usr/local/bin:
#          build-env  a compile step's MAX_JOBS / sccache / arch check (docker/bin/build-env)
#          farm-pip   pip that never swaps our own wheels for registry builds (docker/bin/farm-pip)
#          git-fetch-ref  shallow checkout of a tag, branch or commit (docker/bin/git-fetch-ref)
# No cmake: Triton needs cmake<4 and PyTorch pulls 4.x, so each target installs its own.

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG RUNTIME_IMAGE=rocm-runtime
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${RUNTIME_IMAGE} AS final
ARG PYTHON_VERSION
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive

# Compilers and the libraries the targets link: RDMA and NUMA (UCX, NIXL), autotools (UCX),
# image codecs (torchvision), compression (PyTorch, Triton). python3-venv only bootstraps uv.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        autoconf automake build-essential ca-certificates curl git libtool make patch pkg-config \
        ibverbs-providers libibverbs-dev librdmacm-dev rdma-core libnuma-dev \
        libjpeg-dev libpng-dev liblzma-dev libssl-dev libzstd-dev zlib1g-dev \
        python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

# Python PYTHON_VERSION whatever the distribution ships: a uv-managed CPython under /opt/python
# (pinned uv), and the venv every later step uses on top of it.
RUN --mount=type=cache,target=/root/.cache/uv \
    --mount=type=cache,target=/root/.cache/pip \
    export UV_PYTHON_INSTALL_DIR=/opt/python UV_PYTHON_PREFERENCE=only-managed \
    && python3 -m venv /tmp/uv \
    && /tmp/uv/bin/pip install uv==0.13.9 \
    && /tmp/uv/bin/uv python install "${PYTHON_VERSION}" \
    && /tmp/uv/bin/uv venv --seed --python "${PYTHON_VERSION}" /opt/venv \
    && rm -rf /tmp/uv \
    && /opt/venv/bin/python -c "import sys; assert sys.version.startswith('${PYTHON_VERSION}.'), sys.version"
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    ROCM_HOME=/opt/rocm \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SCCACHE_DIR=/root/.cache/sccache

RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --upgrade "pip>=25" "setuptools>=77" "wheel>=0.45" "packaging>=24" "ninja>=1.11" \
        "pybind11>=2.13" "Cython>=3" sccache==0.16.0

COPY --chmod=0755 docker/bin/build-env docker/bin/farm-pip docker/bin/git-fetch-ref /usr/local/bin/
# hipcc compiles device code with $HIP_CLANG_PATH/clang++: build-env points it at these wrappers.
COPY --chmod=0755 docker/bin/sccache-clang /opt/sccache/bin/clang
RUN ln -s clang /opt/sccache/bin/clang++ \
    && build-env --jobs \
    && farm-pip pins
