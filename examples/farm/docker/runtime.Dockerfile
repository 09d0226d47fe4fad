# runtime: the root of the chain, like rocm-runtime: one arch's runtime.
# Gives: FROM scratch, /opt/runtime, and GPU_ARCH in the image's environment, so each arch's image
#        (and its digest) is its own.
# No `# syntax=` line in these examples: it would pull the Dockerfile frontend from Docker Hub, and
# the demo builds offline with the engine's own.

# Every key of this target's args in bake.hcl ("_common"'s included).
ARG GPU_ARCH
ARG MAX_JOBS
ARG RUN_ID

FROM scratch AS final
ARG GPU_ARCH
ENV GPU_ARCH=${GPU_ARCH}
COPY files/runtime.txt /opt/runtime/README
