# syntax=docker/dockerfile:1
# rocm-runtime: AMD's ROCm userspace (ROCM_IMAGE, rocm/dev-ubuntu-26.04:<ver>-full) pruned to the one
# GPU arch this build is for, and flattened so the pruning actually shrinks the image.
# Takes: ROCM_IMAGE (a registry image in both modes), GPU_ARCH. No named context.
# Gives: /opt/rocm with only GPU_ARCH's kernel files, /etc/gpu-arch naming that arch (build-env
#        refuses to compile for another arch on it), /opt/rocm/lib on the loader path.

# Every key of this target's args in rocm-bake.hcl ("_common"'s included) is declared here. RUN_ID is
# declared here only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID
# changes every run. The default mirrors SDE_ROCM_BASE_IMAGE:SDE_ROCM_VERSION-full; bake always
# passes the arg.
ARG ROCM_IMAGE=rocm/dev-ubuntu-26.04:10.1.0-full
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${ROCM_IMAGE} AS prune
ARG GPU_ARCH
ARG ROCM_VERSION
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
# Pruning: the math libraries keep one kernel file per arch (rocBLAS/hipBLASLt/hipSPARSELt
# TensileLibrary_*_gfxNNN.*, MIOpen's gfxNNN*.kdb), gigabytes in all; a process only loads its GPU's.
# prune-gfx-arches removes other arches' files from those data directories only, keeps GPU_ARCH's
# and its LLVM generic target's, leaves a library with nothing for GPU_ARCH whole, and never
# touches the shared libraries (their fat binaries keep every arch). See docker/bin/prune-gfx-arches.
# The ROCm version inside must be the one the tags say: a mismatch means SDE_ROCM_* drifted.
RUN --mount=type=bind,source=docker/bin/prune-gfx-arches,target=/tmp/prune-gfx-arches \
    found="$(cat /opt/rocm/.info/version)" \
    && case "${found}" in \
         "${ROCM_VERSION}"*) ;; \
         *) echo "rocm-runtime: the ROCm image has ROCm ${found}, ROCM_VERSION says ${ROCM_VERSION}" >&2; exit 1 ;; \
       esac \
    && sh /tmp/prune-gfx-arches "${GPU_ARCH}" /opt/rocm \
    && echo "${GPU_ARCH}" > /etc/gpu-arch \
    && echo /opt/rocm/lib > /etc/ld.so.conf.d/zz-rocm-runtime.conf \
    && ldconfig \
    && env | sort

# Flatten: files deleted in a later layer still ship in the layers below it, so the pruned tree is
# copied onto an empty image. A scratch copy carries no image config, so the environment the farm
# relies on is restated (the ROCm image's own is printed above, for comparison). The whole-filesystem
# copy is the point here, hence DL3067 ignored on it.
FROM scratch AS final
# hadolint ignore=DL3067
COPY --from=prune / /
ENV LANG=C.UTF-8 \
    LC_ALL=C.UTF-8 \
    ROCM_PATH=/opt/rocm \
    PATH=/opt/rocm/bin:/opt/rocm/llvm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["/bin/bash"]
