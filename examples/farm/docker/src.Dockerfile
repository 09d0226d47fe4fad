# src: sources only, no arch, like pytorch-src: one image serves every arch's torch.
# Gives: /src/demo, and busybox (FROM scratch, so it brings its own to RUN with).

ARG GPU_ARCH
ARG MAX_JOBS
ARG RUN_ID
ARG HOLD_S
ARG SRC_REF

FROM scratch AS final
ARG HOLD_S
ARG SRC_REF
# The pin the sources were taken at, as a label: git-fetch-ref's part in the real farm.
LABEL org.opencontainers.image.revision="${SRC_REF}"
COPY busybox /bin/busybox
# Holds the node HOLD_S seconds, as a compile step would; no network: the node has no bridge.
RUN --network=none ["/bin/busybox", "sh", "-c", "sleep \"$HOLD_S\""]
COPY files/src.txt /src/demo/README
# The pin is in the sources too, so a bump changes what torch builds from, as a new ref would.
RUN --network=none ["/bin/busybox", "sh", "-c", "echo \"$SRC_REF\" > /src/demo/REF"]
