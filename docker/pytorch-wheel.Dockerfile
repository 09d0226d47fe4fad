# syntax=docker/dockerfile:1
# pytorch-wheel: the torch wheel pytorch built, on its own, checked against the sources it claims.
# Takes: PYTORCH_IMAGE (named context "pytorch"), SRC_IMAGE (named context "pytorch-src"); each a
#        registry image with PUBLISHED_INPUTS=1. ROCM_VERSION, PYTORCH_VERSION, GPU_ARCH: the
#        version the wheel must carry.
# Gives: FROM scratch, /wheels/torch-*.whl.
# The check matters with PUBLISHED_INPUTS=1, where both inputs come from the registry: a pytorch
# image built from other sources than pytorch-src's fails here instead of being published as a pair.

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG PYTORCH_IMAGE=pytorch
ARG SRC_IMAGE=pytorch-src
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${SRC_IMAGE} AS in-src
FROM ${PYTORCH_IMAGE} AS in-pytorch

FROM in-pytorch AS check
ARG GPU_ARCH
ARG ROCM_VERSION
ARG PYTORCH_VERSION
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
# torch/version.py in the wheel records the version and the commit it was built from.
RUN --mount=type=bind,from=in-src,source=/src/pytorch/.git,target=/tmp/src.git \
    commit="$(git --git-dir=/tmp/src.git rev-parse HEAD)" \
    && shopt -s nullglob \
    && wheels=(/wheels/torch-*.whl) \
    && [ "${#wheels[@]}" -eq 1 ] \
    && python -c "import sys, zipfile; ns = {}; exec(zipfile.ZipFile(sys.argv[1]).read('torch/version.py'), ns); v, g = ns['__version__'], ns['git_version']; print('wheel', v, g); assert v == sys.argv[2], f'version {v}, expected {sys.argv[2]}'; assert g == sys.argv[3], f'built from {g}, pytorch-src is {sys.argv[3]}'" \
        "${wheels[0]}" "${PYTORCH_VERSION}+rocm${ROCM_VERSION}.${GPU_ARCH}" "${commit}" \
    && mkdir -p /out \
    && cp "${wheels[0]}" /out/

FROM scratch AS final
COPY --from=check /out/ /wheels/
