# syntax=docker/dockerfile:1
# pytorch-src: PyTorch's sources at PYTORCH_REF with every submodule -- no compiler, no arch, so one
# image serves every arch's pytorch build.
# Takes: PYTORCH_REF (a tag, branch or commit); no named context.
# Gives: FROM scratch, /src/pytorch: the checkout with a shallow .git (PyTorch's version.py records
#        the commit from it, and pytorch-wheel checks the wheel against it).

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
ARG PYTORCH_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM debian:trixie-slim AS fetch
ARG PYTORCH_REF
ARG PYTORCH_VERSION
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates git \
    && rm -rf /var/lib/apt/lists/*
# The ref must be the version the tags say (version.txt reads e.g. 2.15.0a0 on the release branch).
RUN --mount=type=bind,source=docker/bin/git-fetch-ref,target=/tmp/git-fetch-ref \
    sh /tmp/git-fetch-ref https://github.com/pytorch/pytorch.git "${PYTORCH_REF}" /src/pytorch --submodules \
    && found="$(cat /src/pytorch/version.txt)" \
    && case "${found}" in \
         "${PYTORCH_VERSION}"*) ;; \
         *) echo "pytorch-src: ${PYTORCH_REF} is PyTorch ${found}, PYTORCH_VERSION says ${PYTORCH_VERSION}" >&2; exit 1 ;; \
       esac

FROM scratch AS final
COPY --from=fetch /src/pytorch /src/pytorch
