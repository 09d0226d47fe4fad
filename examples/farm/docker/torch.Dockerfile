# torch: the join, like pytorch: the arch's base with the noarch sources built into it.
# Takes: SRC_IMAGE (named context "src"), BASE_IMAGE ("base"); each a registry image with
#        PUBLISHED_INPUTS=1.
# Gives: the base plus /src/demo, and its "wheel" in /wheels, named for the arch as torch's are.

ARG SRC_IMAGE=src
ARG BASE_IMAGE=base
ARG GPU_ARCH
ARG MAX_JOBS
ARG RUN_ID
ARG HOLD_S

FROM ${SRC_IMAGE} AS in-src

FROM ${BASE_IMAGE} AS final
ARG GPU_ARCH
ARG HOLD_S
COPY --from=in-src /src/demo /src/demo
# Holds the node HOLD_S seconds, as a compile step would; no network: the node has no bridge.
RUN --network=none ["/bin/busybox", "sh", "-c", "sleep \"$HOLD_S\""]
COPY files/torch.txt /wheels/torch-1.0+demo.${GPU_ARCH}.txt
