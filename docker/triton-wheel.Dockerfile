# syntax=docker/dockerfile:1
# triton-wheel: Triton at TRITON_REF built into a wheel. Noarch: Triton JIT-compiles kernels for
# whatever GPU it runs on, so one wheel serves every arch. Builds beside PyTorch, not on it: Triton
# needs cmake<4 and PyTorch pulls cmake 4.x.
# Takes: BASE_IMAGE (named context "pytorch-base", or its registry image with PUBLISHED_INPUTS=1),
#        TRITON_REF (a tag, branch or commit of triton-lang/triton).
# Gives: FROM scratch, /wheels/triton-*.whl.

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG BASE_IMAGE=pytorch-base
ARG TRITON_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${BASE_IMAGE} AS build
ARG TRITON_REF
ARG MAX_JOBS
ARG SCCACHE_LOG
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
RUN git-fetch-ref https://github.com/triton-lang/triton.git "${TRITON_REF}" /build/triton
# setup.py sits at the top of newer trees and under python/ in older ones.
WORKDIR /build/triton
RUN --mount=type=cache,target=/root/.cache/pip \
    farm-pip install "cmake>=3.20,<4" \
    && farm-pip build-deps "$(if [ -f setup.py ]; then echo .; else echo python; fi)"
# TRITON_CODEGEN_BACKENDS=amd: only the AMD backend (no CUDA toolchain download). ~/.triton holds the
# LLVM build setup.py downloads, cached across builds.
RUN --mount=type=cache,target=/root/.cache/sccache \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/root/.triton \
    if [ -f setup.py ]; then dir=.; else dir=python; fi \
    && TRITON_CODEGEN_BACKENDS=amd build-env \
        pip wheel --no-build-isolation --no-deps --verbose --wheel-dir /dist "${dir}" \
    && ls -l /dist/triton-*.whl

FROM scratch AS final
COPY --from=build /dist/ /wheels/
