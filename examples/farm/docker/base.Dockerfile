# base: the runtime plus what every build needs, like pytorch-base.
# Takes: RUNTIME_IMAGE (named context "runtime", or its registry image with PUBLISHED_INPUTS=1).

ARG RUNTIME_IMAGE=runtime
ARG GPU_ARCH
ARG MAX_JOBS
ARG RUN_ID

FROM ${RUNTIME_IMAGE} AS final
COPY files/base.txt /opt/base/README
