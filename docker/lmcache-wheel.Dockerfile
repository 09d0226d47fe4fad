# syntax=docker/dockerfile:1
# lmcache-wheel: the LMCache wheel lmcache built, on its own. vLLM installs it: it ships the LMCache
# MP connector but imports lmcache.utils from this wheel.
# Takes: LMCACHE_IMAGE (named context "lmcache", or its registry image with PUBLISHED_INPUTS=1).
# Gives: FROM scratch, /wheels/lmcache-*.whl.

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG LMCACHE_IMAGE=lmcache
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${LMCACHE_IMAGE} AS in-lmcache

FROM scratch AS final
COPY --from=in-lmcache /wheels/lmcache-*.whl /wheels/
