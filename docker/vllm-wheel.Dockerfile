# syntax=docker/dockerfile:1
# vllm-wheel: the vLLM wheel vllm built, on its own.
# Takes: VLLM_IMAGE (named context "vllm", or its registry image with PUBLISHED_INPUTS=1).
# Gives: FROM scratch, /wheels/vllm-*.whl, labelled with the vLLM ref (VLLM_REF) it was built from.

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG VLLM_IMAGE=vllm
ARG VLLM_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${VLLM_IMAGE} AS in-vllm

FROM scratch AS final
ARG VLLM_REF
LABEL org.opencontainers.image.version="${VLLM_REF}"
COPY --from=in-vllm /wheels/vllm-*.whl /wheels/
