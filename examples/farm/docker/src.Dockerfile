# src: sources only, no arch, like pytorch-src: one image serves every arch's torch.
# Gives: FROM scratch, /src/demo.

ARG GPU_ARCH
ARG MAX_JOBS
ARG RUN_ID

FROM scratch AS final
COPY files/src.txt /src/demo/README
