# syntax=docker/dockerfile:1
# pytorch-test: pytorch plus a GPU check as its entrypoint, for a GPU node (make test). The check
# exits 1 when torch.cuda.is_available() is false, and a BuildKit RUN step has no /dev/kfd, so it
# is never a RUN step: building this image checks nothing, running it does.
# Takes: PYTORCH_IMAGE (named context "pytorch", or its registry image with PUBLISHED_INPUTS=1),
#        GPU_ARCH (the arch the check expects the GPU to be).
# Gives: pytorch with /usr/local/bin/gpu-check as ENTRYPOINT: exit 0 only when a GPU of GPU_ARCH is
#        visible and a GEMM on it matches the CPU's (docker/bin/gpu-check).
#   docker run --rm --device /dev/kfd --device /dev/dri --group-add video <image>

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG PYTORCH_IMAGE=pytorch
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${PYTORCH_IMAGE} AS final
ARG GPU_ARCH
ENV EXPECTED_GPU_ARCH=${GPU_ARCH}
COPY --chmod=0755 docker/bin/gpu-check /usr/local/bin/gpu-check
ENTRYPOINT ["python", "/usr/local/bin/gpu-check"]
