# syntax=docker/dockerfile:1
# pytorch-run: the runtime image -- rocm-runtime plus Python and the torch and triton wheels
# pytorch built, without pytorch-base's compilers and build libraries.
# Takes: RUNTIME_IMAGE (named context "rocm-runtime", or its registry image with
#        PUBLISHED_INPUTS=1), PYTORCH_IMAGE = "pytorch" in both modes: a docker-image:// context of
#        the published pytorch image, so it resolves whether or not this run builds pytorch.
# Gives: /opt/venv (on PATH) with torch and triton from pytorch's /wheels, and the interpreter
#        pytorch was built with (pytorch-base's /opt/python).

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG RUNTIME_IMAGE=rocm-runtime
ARG PYTORCH_IMAGE=pytorch
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${PYTORCH_IMAGE} AS in-pytorch

FROM ${RUNTIME_IMAGE} AS final
ARG PYTHON_VERSION
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]
COPY --from=in-pytorch /opt/python /opt/python
# A fresh venv on the same interpreter (pyvenv.cfg's home names it), holding only the wheels.
RUN --mount=type=bind,from=in-pytorch,source=/wheels,target=/tmp/wheels \
    --mount=type=bind,from=in-pytorch,source=/opt/venv/pyvenv.cfg,target=/tmp/pyvenv.cfg \
    --mount=type=cache,target=/root/.cache/pip \
    home="$(sed -n 's/^home = //p' /tmp/pyvenv.cfg)" \
    && "${home}/python3" -m venv /opt/venv \
    && /opt/venv/bin/python -c "import sys; assert sys.version.startswith('${PYTHON_VERSION}.'), sys.version" \
    && /opt/venv/bin/pip install --disable-pip-version-check /tmp/wheels/triton-*.whl /tmp/wheels/torch-*.whl \
    && /opt/venv/bin/python -c "import torch; assert torch.version.hip, 'not a ROCm build'; print('torch', torch.__version__, 'HIP', torch.version.hip)"
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH}
