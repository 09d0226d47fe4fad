# syntax=docker/dockerfile:1
# pytorch: PyTorch built from source for the one arch GPU_ARCH, installed with the farm's Triton.
# Takes: SRC_IMAGE (named context "pytorch-src"), BASE_IMAGE (named context "pytorch-base"),
#        TRITON_WHEEL_IMAGE (named context "triton-wheel"); each a registry image with
#        PUBLISHED_INPUTS=1. GPU_ARCH (PYTORCH_ROCM_ARCH), MAX_JOBS (empty: build-env derives it),
#        SCCACHE_LOG, ROCM_VERSION and PYTORCH_VERSION (the wheel's version).
# Gives: pytorch-base plus torch and triton installed in /opt/venv, and both wheels in /wheels
#        (torch-*.whl for pytorch-wheel, the pair for pytorch-run).

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG SRC_IMAGE=pytorch-src
ARG BASE_IMAGE=pytorch-base
ARG TRITON_WHEEL_IMAGE=triton-wheel
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${SRC_IMAGE} AS in-src
FROM ${TRITON_WHEEL_IMAGE} AS in-triton
FROM ${BASE_IMAGE} AS base

FROM base AS build
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG ROCM_VERSION
ARG PYTORCH_VERSION
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
# A copy, not a mount: hipify rewrites the tree in place.
COPY --from=in-src /src/pytorch /build/pytorch
WORKDIR /build/pytorch
# Build requirements (cmake 4.x among them), and MKL as static libraries, so the wheel needs no
# BLAS at run time (pytorch-run has none).
RUN --mount=type=cache,target=/root/.cache/pip \
    farm-pip build-deps . \
    && farm-pip install -r requirements.txt mkl-static mkl-include
# CUDA sources to HIP, once, before the build (PyTorch's ROCm build requires it).
RUN python tools/amd_build/build_amd.py
# PYTORCH_ROCM_ARCH: kernels for GPU_ARCH only. The version names ROCm and the arch, so a wheel says
# what it was built for. CMAKE_PREFIX_PATH lets CMake find the pip-installed MKL.
RUN --mount=type=cache,target=/root/.cache/sccache \
    --mount=type=cache,target=/root/.cache/pip \
    export USE_ROCM=1 BUILD_TEST=0 \
        PYTORCH_ROCM_ARCH="${GPU_ARCH}" \
        PYTORCH_BUILD_VERSION="${PYTORCH_VERSION}+rocm${ROCM_VERSION}.${GPU_ARCH}" \
        PYTORCH_BUILD_NUMBER=1 \
        CMAKE_PREFIX_PATH=/opt/venv \
    && build-env pip wheel --no-build-isolation --no-deps --verbose --wheel-dir /dist . \
    && ls -l /dist/torch-*.whl

FROM base AS final
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
COPY --from=build /dist/ /wheels/
COPY --from=in-triton /wheels/ /wheels/
RUN --mount=type=cache,target=/root/.cache/pip \
    farm-pip install-wheels /wheels/triton-*.whl /wheels/torch-*.whl \
    && python -c "import torch, triton; assert torch.version.hip, 'not a ROCm build'; print('torch', torch.__version__, 'HIP', torch.version.hip, 'triton', triton.__version__)"
