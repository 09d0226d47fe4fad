# syntax=docker/dockerfile:1
# vllm: vLLM at VLLM_REF built for ROCm and GPU_ARCH, in an image that installs every wheel input:
# Triton, AITER, NIXL, LMCache (vLLM's MP connector imports lmcache.utils) and our torchvision
# (timm requires torchvision, and transformers' image_utils imports torchvision.io: the registry's
# is a CUDA build that cannot load here).
# Takes: PYTORCH_IMAGE (named context "pytorch"), TRITON_WHEEL_IMAGE ("triton-wheel"),
#        AITER_WHEEL_IMAGE ("aiter-wheel"), NIXL_WHEEL_IMAGE ("nixl-wheel"), LMCACHE_WHEEL_IMAGE
#        ("lmcache-wheel"), TORCHVISION_WHEEL_IMAGE ("torchvision-wheel"); each a registry image
#        with PUBLISHED_INPUTS=1. VLLM_REF, GPU_ARCH.
# Gives: pytorch plus all of the above and vllm installed in /opt/venv; the vllm wheel in /wheels
#        (beside pytorch's torch and triton), where vllm-wheel takes it from.

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG PYTORCH_IMAGE=pytorch
ARG TRITON_WHEEL_IMAGE=triton-wheel
ARG AITER_WHEEL_IMAGE=aiter-wheel
ARG NIXL_WHEEL_IMAGE=nixl-wheel
ARG LMCACHE_WHEEL_IMAGE=lmcache-wheel
ARG TORCHVISION_WHEEL_IMAGE=torchvision-wheel
ARG VLLM_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${TRITON_WHEEL_IMAGE} AS in-triton
FROM ${AITER_WHEEL_IMAGE} AS in-aiter
FROM ${NIXL_WHEEL_IMAGE} AS in-nixl
FROM ${LMCACHE_WHEEL_IMAGE} AS in-lmcache
FROM ${TORCHVISION_WHEEL_IMAGE} AS in-torchvision

# Inputs first, so vLLM builds against exactly what the image runs. LMCache's ROCm requirements name
# cupy-rocm-7-0 and NIXL's CUDA builds are nixl-cu*: skipped, neither belongs in this image (the
# LMCache MP server, which needs cupy, runs from the lmcache image). amdsmi, from ROCm's own tree, is
# how vLLM detects a ROCm platform at all.
FROM ${PYTORCH_IMAGE} AS base
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
RUN --mount=type=bind,from=in-triton,source=/wheels,target=/tmp/in-triton \
    --mount=type=bind,from=in-aiter,source=/wheels,target=/tmp/in-aiter \
    --mount=type=bind,from=in-nixl,source=/wheels,target=/tmp/in-nixl \
    --mount=type=bind,from=in-lmcache,source=/wheels,target=/tmp/in-lmcache \
    --mount=type=bind,from=in-torchvision,source=/wheels,target=/tmp/in-torchvision \
    --mount=type=cache,target=/root/.cache/pip \
    cp -r /opt/rocm/share/amd_smi /tmp/amd_smi \
    && farm-pip install /tmp/amd_smi \
    && rm -rf /tmp/amd_smi \
    && farm-pip install-wheels --skip "cupy-*" --skip "nixl-cu*" \
        /tmp/in-triton/*.whl /tmp/in-torchvision/*.whl /tmp/in-aiter/*.whl /tmp/in-nixl/*.whl \
        /tmp/in-lmcache/*.whl

FROM base AS build
ARG VLLM_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
RUN git-fetch-ref https://github.com/vllm-project/vllm.git "${VLLM_REF}" /build/vllm
WORKDIR /build/vllm
# use_existing_torch.py strips vLLM's own torch pins from its requirement files. cmake<4 as vLLM's
# ROCm build requirements ask. Everything else under farm-pip's pins, so no requirement swaps one
# of our wheels for a registry build.
RUN --mount=type=cache,target=/root/.cache/pip \
    if [ -f use_existing_torch.py ]; then python use_existing_torch.py; fi \
    && farm-pip install "cmake>=3.26.1,<4" \
    && farm-pip build-deps . \
    && farm-pip install -r requirements/rocm.txt
RUN --mount=type=cache,target=/root/.cache/sccache \
    --mount=type=cache,target=/root/.cache/pip \
    VLLM_TARGET_DEVICE=rocm PYTORCH_ROCM_ARCH="${GPU_ARCH}" build-env \
        pip wheel --no-build-isolation --no-deps --verbose --wheel-dir /dist . \
    && ls -l /dist/vllm-*.whl

# The image checks that every wheel input is installed (and none was replaced by a registry build:
# farm-pip pins lists only wheels installed from files), and that the imports the graph exists for
# work: torchvision.io (transformers' image_utils) and lmcache.utils (vLLM's MP connector).
FROM base AS final
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
COPY --from=build /dist/ /wheels/
RUN --mount=type=cache,target=/root/.cache/pip \
    farm-pip install-wheels --skip "cupy-*" --skip "nixl-cu*" /wheels/vllm-*.whl \
    && farm-pip pins | tee /tmp/pins \
    && for dist in torch triton torchvision amd-aiter lmcache vllm; do \
         grep -q "^${dist}==" /tmp/pins || { echo "vllm: ${dist} is not installed from our wheel" >&2; exit 1; }; \
       done \
    && grep -q "^nixl" /tmp/pins \
    && rm /tmp/pins \
    && python -c "import torchvision.io, lmcache.utils, vllm; print('vllm', vllm.__version__)"
