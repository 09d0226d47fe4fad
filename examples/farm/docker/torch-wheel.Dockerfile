# torch-wheel: only torch's /wheels, like pytorch-wheel.
# Takes: TORCH_IMAGE (named context "torch", or its registry image with PUBLISHED_INPUTS=1).

ARG TORCH_IMAGE=torch
ARG GPU_ARCH
ARG MAX_JOBS
ARG RUN_ID
ARG HOLD_S

# The hold runs in torch's image (it has busybox); the final image keeps only the wheels.
FROM ${TORCH_IMAGE} AS in-torch
ARG HOLD_S
# Holds the node HOLD_S seconds, as a compile step would; no network: the node has no bridge.
RUN --network=none ["/bin/busybox", "sh", "-c", "sleep \"$HOLD_S\""]

FROM scratch AS final
COPY --from=in-torch /wheels/ /wheels/
