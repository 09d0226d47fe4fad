# syntax=docker/dockerfile:1
# lmcache: LMCache at LMCACHE_REF with its HIP extension built for GPU_ARCH, installed with what its
# MP server needs -- our cupy (imported at module scope: without it the server dies on the first
# request), NIXL and Triton. No AITER: LMCache moves caches, it does not run GEMMs.
# Takes: PYTORCH_IMAGE (named context "pytorch"), TRITON_WHEEL_IMAGE ("triton-wheel"),
#        NIXL_WHEEL_IMAGE ("nixl-wheel"), CUPY_WHEEL_IMAGE ("cupy-wheel"); each a registry image
#        with PUBLISHED_INPUTS=1. LMCACHE_REF, GPU_ARCH.
# Gives: pytorch plus cupy, nixl, triton and lmcache installed in /opt/venv; the lmcache wheel in
#        /wheels (beside pytorch's torch and triton), where lmcache-wheel takes it from.

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG PYTORCH_IMAGE=pytorch
ARG TRITON_WHEEL_IMAGE=triton-wheel
ARG NIXL_WHEEL_IMAGE=nixl-wheel
ARG CUPY_WHEEL_IMAGE=cupy-wheel
ARG LMCACHE_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${TRITON_WHEEL_IMAGE} AS in-triton
FROM ${NIXL_WHEEL_IMAGE} AS in-nixl
FROM ${CUPY_WHEEL_IMAGE} AS in-cupy

# Inputs first, so the extension builds against exactly what the image runs. LMCache's ROCm
# requirements name cupy-rocm-7-0 (a registry cupy beside ours would shadow it) and CUDA NIXL
# builds may be named nixl-cu*: both are skipped, ours provide them.
FROM ${PYTORCH_IMAGE} AS base
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
RUN --mount=type=bind,from=in-triton,source=/wheels,target=/tmp/in-triton \
    --mount=type=bind,from=in-nixl,source=/wheels,target=/tmp/in-nixl \
    --mount=type=bind,from=in-cupy,source=/wheels,target=/tmp/in-cupy \
    --mount=type=cache,target=/root/.cache/pip \
    farm-pip install-wheels --skip "nixl-cu*" /tmp/in-triton/*.whl /tmp/in-nixl/*.whl /tmp/in-cupy/*.whl

FROM base AS build
ARG LMCACHE_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
RUN git-fetch-ref https://github.com/LMCache/LMCache.git "${LMCACHE_REF}" /build/lmcache
WORKDIR /build/lmcache
RUN --mount=type=cache,target=/root/.cache/pip \
    farm-pip build-deps --skip "cupy-*" . \
    && if [ -f requirements/build.txt ]; then farm-pip install -r requirements/build.txt; fi
# The HIP extension: BUILD_WITH_HIP=1 (LMCACHE_TARGET_DEVICE=HIP in older trees) and hipcc as the
# compiler, as LMCache's own ROCm recipe does; PYTORCH_ROCM_ARCH picks the arch.
RUN --mount=type=cache,target=/root/.cache/sccache \
    --mount=type=cache,target=/root/.cache/pip \
    BUILD_WITH_HIP=1 LMCACHE_TARGET_DEVICE=HIP CXX=hipcc PYTORCH_ROCM_ARCH="${GPU_ARCH}" build-env \
        pip wheel --no-build-isolation --no-deps --verbose --wheel-dir /dist . \
    && ls -l /dist/lmcache-*.whl

FROM base AS final
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
COPY --from=build /dist/ /wheels/
RUN --mount=type=cache,target=/root/.cache/pip \
    farm-pip install-wheels --skip "cupy-*" --skip "nixl-cu*" /wheels/lmcache-*.whl \
    && python -c "import torch, cupy, lmcache, lmcache.c_ops; print('lmcache', lmcache.__file__, 'cupy', cupy.__version__)"
