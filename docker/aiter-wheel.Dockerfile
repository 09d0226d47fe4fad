# syntax=docker/dockerfile:1
# aiter-wheel: AMD's AITER kernels (ROCm/aiter at AITER_REF) built into a wheel against our torch
# and Triton, for GPU_ARCH.
# Takes: PYTORCH_IMAGE (named context "pytorch"), TRITON_WHEEL_IMAGE (named context
#        "triton-wheel"); each a registry image with PUBLISHED_INPUTS=1. AITER_REF, GPU_ARCH.
# Gives: FROM scratch, /wheels/amd_aiter-*.whl.

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG PYTORCH_IMAGE=pytorch
ARG TRITON_WHEEL_IMAGE=triton-wheel
ARG AITER_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${TRITON_WHEEL_IMAGE} AS in-triton
FROM ${PYTORCH_IMAGE} AS build
ARG AITER_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
# The Triton this target was given (the one pytorch carries, unless the inputs disagree).
RUN --mount=type=bind,from=in-triton,source=/wheels,target=/tmp/in-triton \
    --mount=type=cache,target=/root/.cache/pip \
    farm-pip install-wheels /tmp/in-triton/triton-*.whl
# Submodules: composable_kernel, which AITER's C++ kernels are written in.
RUN git-fetch-ref https://github.com/ROCm/aiter.git "${AITER_REF}" /build/aiter --submodules
WORKDIR /build/aiter
RUN --mount=type=cache,target=/root/.cache/pip \
    farm-pip build-deps . \
    && farm-pip install -r requirements.txt
# GPU_ARCHS: kernels for GPU_ARCH only. AITER_USE_SYSTEM_TRITON=1: keep ours (setup.py otherwise
# installs its own). PREBUILD_KERNELS=1 compiles the CK modules ahead of time where AITER tunes
# them (CDNA3/CDNA4: gfx942, gfx950); on other arches they stay JIT, built on first use.
RUN --mount=type=cache,target=/root/.cache/sccache \
    --mount=type=cache,target=/root/.cache/pip \
    case "${GPU_ARCH}" in gfx942 | gfx950) prebuild=1 ;; *) prebuild=0 ;; esac \
    && GPU_ARCHS="${GPU_ARCH}" PYTORCH_ROCM_ARCH="${GPU_ARCH}" AITER_USE_SYSTEM_TRITON=1 \
        BUILD_TARGET=rocm PREBUILD_KERNELS="${prebuild}" build-env \
        pip wheel --no-build-isolation --no-deps --verbose --wheel-dir /dist . \
    && ls -l /dist/*.whl

FROM scratch AS final
COPY --from=build /dist/ /wheels/
