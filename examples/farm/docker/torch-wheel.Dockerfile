# torch-wheel: only torch's /wheels, like pytorch-wheel.
# Takes: TORCH_IMAGE (named context "torch", or its registry image with PUBLISHED_INPUTS=1).

ARG TORCH_IMAGE=torch
ARG GPU_ARCH
ARG MAX_JOBS
ARG RUN_ID

FROM ${TORCH_IMAGE} AS in-torch

FROM scratch AS final
COPY --from=in-torch /wheels/ /wheels/
