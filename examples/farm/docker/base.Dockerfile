# base: the runtime plus what every build needs, like pytorch-base.
# Takes: RUNTIME_IMAGE (named context "runtime", or its registry image with PUBLISHED_INPUTS=1).

ARG RUNTIME_IMAGE=runtime
ARG GPU_ARCH
ARG MAX_JOBS
ARG RUN_ID
ARG HOLD_S

FROM ${RUNTIME_IMAGE} AS final
ARG HOLD_S
# Holds the node HOLD_S seconds, as a compile step would; no network: the node has no bridge.
RUN --network=none ["/bin/busybox", "sh", "-c", "sleep \"$HOLD_S\""]
COPY files/base.txt /opt/base/README
