# runtime: the root of the chain, like rocm-runtime: one arch's runtime.
# Gives: FROM scratch, Debian's static busybox as /bin/busybox (every image built on this one can
#        RUN, offline), /opt/runtime, and GPU_ARCH in the image's environment, so each arch's
#        image (and its digest) is its own.
# No `# syntax=` line in these examples: it would pull the Dockerfile frontend from Docker Hub, and
# the demo builds offline with the engine's own.

# Every key of this target's args in bake.hcl ("_common"'s included).
ARG GPU_ARCH
ARG MAX_JOBS
ARG RUN_ID
ARG HOLD_S

FROM scratch AS final
ARG GPU_ARCH
ARG HOLD_S
ENV GPU_ARCH=${GPU_ARCH}
# `make demo` puts it beside bake.hcl (examples/farm/busybox, git-ignored).
COPY busybox /bin/busybox
# Holds the node HOLD_S seconds, as a compile step would; no network: the node has no bridge.
RUN --network=none ["/bin/busybox", "sh", "-c", "sleep \"$HOLD_S\""]
COPY files/runtime.txt /opt/runtime/README
