# src: sources only, no arch, like pytorch-src: one image serves every arch's torch.
# Gives: /src/demo, and busybox (FROM scratch, so it brings its own to RUN with).

ARG GPU_ARCH
ARG MAX_JOBS
ARG RUN_ID
ARG HOLD_S

FROM scratch AS final
ARG HOLD_S
COPY busybox /bin/busybox
# Holds the node HOLD_S seconds, as a compile step would; no network: the node has no bridge.
RUN --network=none ["/bin/busybox", "sh", "-c", "sleep \"$HOLD_S\""]
COPY files/src.txt /src/demo/README
