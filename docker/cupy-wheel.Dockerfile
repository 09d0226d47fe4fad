# syntax=docker/dockerfile:1
# cupy-wheel: CuPy at CUPY_REF built for ROCm (CUPY_INSTALL_USE_HIP=1) and GPU_ARCH. No torch in it,
# so it builds on the base. Required, not optional: LMCache's MP server imports cupy at module scope,
# and no published cupy wheel fits this ROCm.
# Takes: BASE_IMAGE (named context "pytorch-base", or its registry image with PUBLISHED_INPUTS=1),
#        CUPY_REF (a tag, branch or commit of cupy/cupy), GPU_ARCH.
# Gives: FROM scratch, /wheels/cupy-*.whl (distribution name "cupy").

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG BASE_IMAGE=pytorch-base
ARG CUPY_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${BASE_IMAGE} AS build
ARG CUPY_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
# Submodules: CuPy vendors CCCL, jitify and DLPack headers.
RUN git-fetch-ref https://github.com/cupy/cupy.git "${CUPY_REF}" /build/cupy --submodules
WORKDIR /build/cupy
RUN --mount=type=cache,target=/root/.cache/pip \
    farm-pip install "Cython>=3" fastrlock numpy \
    && farm-pip build-deps .
# HCC_AMDGPU_TARGET: the one arch the kernels are compiled for; build-env sets CUPY_NUM_BUILD_JOBS.
RUN --mount=type=cache,target=/root/.cache/sccache \
    --mount=type=cache,target=/root/.cache/pip \
    CUPY_INSTALL_USE_HIP=1 ROCM_HOME=/opt/rocm HCC_AMDGPU_TARGET="${GPU_ARCH}" build-env \
        pip wheel --no-build-isolation --no-deps --verbose --wheel-dir /dist . \
    && ls -l /dist/cupy-*.whl

FROM scratch AS final
COPY --from=build /dist/ /wheels/
