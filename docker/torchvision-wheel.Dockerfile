# syntax=docker/dockerfile:1
# torchvision-wheel: torchvision at TORCHVISION_REF built for ROCm against our torch. PyPI has only
# CUDA builds of it, and vLLM needs one (its build requirements pull timm, timm requires
# torchvision, transformers' image_utils imports torchvision.io). Its setup.py imports torch to
# decide it is building for ROCm at all, so it builds on pytorch -- and cannot be installed into it.
# Takes: PYTORCH_IMAGE (named context "pytorch", or its registry image with PUBLISHED_INPUTS=1),
#        TORCHVISION_REF, GPU_ARCH.
# Gives: FROM scratch, /wheels/torchvision-*.whl.

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG PYTORCH_IMAGE=pytorch
ARG TORCHVISION_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${PYTORCH_IMAGE} AS build
ARG TORCHVISION_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG ROCM_VERSION
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
RUN git-fetch-ref https://github.com/pytorch/vision.git "${TORCHVISION_REF}" /build/vision
WORKDIR /build/vision
RUN --mount=type=cache,target=/root/.cache/pip \
    farm-pip build-deps .
# setup.py builds the GPU ops when torch.version.hip and ROCM_HOME say ROCm and a GPU is visible --
# none is at build time, so FORCE_CUDA=1. The check after the build fails a wheel whose _C links
# no HIP library (a CPU-only build).
# BUILD_VERSION: the tag's version plus ROCm and the arch; PYTORCH_VERSION (torch's own, read from
# the installed torch) pins the wheel's torch requirement to the torch it was built against.
RUN --mount=type=cache,target=/root/.cache/sccache \
    --mount=type=cache,target=/root/.cache/pip \
    version="$(cat version.txt)" \
    && torch_version="$(python -c 'import torch; print(torch.__version__.split("+")[0])')" \
    && FORCE_CUDA=1 PYTORCH_ROCM_ARCH="${GPU_ARCH}" \
        BUILD_VERSION="${version%a0}+rocm${ROCM_VERSION}.${GPU_ARCH}" PYTORCH_VERSION="${torch_version}" \
        build-env pip wheel --no-build-isolation --no-deps --verbose --wheel-dir /dist . \
    && python -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); ext = [n for n in z.namelist() if n.startswith('torchvision/_C') and n.endswith('.so')]; assert ext, 'no torchvision._C in the wheel'; data = z.read(ext[0]); assert b'amdhip64' in data or b'c10_hip' in data, 'torchvision._C links no HIP library: a CPU-only build'" /dist/torchvision-*.whl \
    && ls -l /dist/torchvision-*.whl

FROM scratch AS final
COPY --from=build /dist/ /wheels/
