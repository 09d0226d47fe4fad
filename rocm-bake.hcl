# rocm-bake.hcl: the ROCm build farm's one build graph.
#
# Bake derives the DAG from the named contexts each target takes, so this file is the only place
# that states targets and edges. rocm-assets reads it to make one Dagster asset per target.
#
#   docker buildx bake -f rocm-bake.hcl --print vllm        # what bake would build
#   PUBLISHED_INPUTS=1 docker buildx bake -f rocm-bake.hcl vllm   # inputs from the registry
#
# Env-only settings (bake reads them from the environment, so `VAR=x make ...`, not `make ... VAR=x`):
# PUBLISHED_INPUTS, GPU_ARCH, REGISTRY, RUN_ID, CACHE_TAG_SUFFIX, SCCACHE_LOG, MAX_JOBS, SDE_*.
#
# Written for every buildx people have: Debian 13's 0.13 rejects a variable's `description` and
# `validation`, so descriptions are comments and the arch check is not here. rocm-assets adds it
# where buildx has validation (0.19 and later): rocm_assets/core/bake/arch_check.hcl, passed as a
# second `-f`. On older buildx rocm-assets checks GPU_ARCH itself.

# ---------------------------------------------------------------------------------------------
# The GPU arches the farm builds: one build per arch, and one Dagster partition per entry.
# Add an arch here and it becomes a partition that can be backfilled, with no code change.
# A variable, not a top-level attribute: bake's validation sees variables only.
variable "GPU_ARCHES" {
  default = ["gfx942", "gfx950", "gfx1100", "gfx1201", "gfx1250"]
}

# The one GPU arch this invocation builds for: one of GPU_ARCHES.
variable "GPU_ARCH" {
  default = "gfx942"
}

# Registry host (and port) every image is pushed to and read from.
variable "REGISTRY" {
  default = "zot.snoc.lan:5000"
}

# Repository namespace under REGISTRY.
variable "NAMESPACE" {
  default = "rocm-pytorch"
}

# A bool default makes env PUBLISHED_INPUTS=1 parse as true (bake's strconv.ParseBool).
# 1: take every sibling input from the registry (cross-node scheduling); 0: build in-process.
variable "PUBLISHED_INPUTS" {
  default = false
}

# Stamped into each BuildKit history record name.
variable "RUN_ID" {
  default = "dev"
}

# Appended to registry cache tags, to keep an experiment's cache apart.
variable "CACHE_TAG_SUFFIX" {
  default = ""
}

# sccache log level inside compile steps (empty: off).
variable "SCCACHE_LOG" {
  default = ""
}

# Compile jobs; empty lets the build derive it from MemAvailable at 2 GB per job.
variable "MAX_JOBS" {
  default = ""
}

# SDE_*: source, dependency and environment pins, overridable from env one at a time.
variable "SDE_ROCM_VERSION" {
  default = "10.1.0"
}
variable "SDE_ROCM_BASE_IMAGE" {
  default = "rocm/dev-ubuntu-26.04"
}
variable "SDE_PYTHON_VERSION" {
  default = "3.12"
}
variable "SDE_PYTORCH_VERSION" {
  default = "2.15.0"
}
variable "SDE_TRITON_VERSION" {
  default = "3.7.0"
}
variable "SDE_PYTORCH_REF" {
  default = "v2.15.0"
}
variable "SDE_TRITON_REF" {
  default = "release/3.7.x"
}
variable "SDE_TORCHVISION_REF" {
  default = "v0.30.0"
}
variable "SDE_CUPY_REF" {
  default = "v14.0.0"
}
variable "SDE_AITER_REF" {
  default = "main"
}
variable "SDE_UCX_REF" {
  default = "v1.19.0"
}
variable "SDE_NIXL_REF" {
  default = "0.7.0"
}
variable "SDE_LMCACHE_REF" {
  default = "v0.4.0"
}
variable "SDE_VLLM_REF" {
  default = "v0.13.0"
}

# ---------------------------------------------------------------------------------------------
# Top-level attributes play the role of locals (bake has no locals block).
USE_PUB   = PUBLISHED_INPUTS
ROCM_TAG  = "${SDE_ROCM_VERSION}-full-${GPU_ARCH}"
TORCH_TAG = "${SDE_PYTORCH_VERSION}-${SDE_ROCM_VERSION}-full-${GPU_ARCH}"

# Targets that test another target's image rather than publish one. They need a GPU, which a
# BuildKit RUN step never has, so rocm-assets runs each as an asset check on its one input.
TEST_TARGETS = ["pytorch-test"]

function "img" {
  params = [repo, tag]
  result = "${REGISTRY}/${NAMESPACE}/${repo}:${tag}"
}

function "build_name" {
  params = [target, arch]
  result = "rocm-pytorch-build/${target}/${arch}/${RUN_ID}"
}

function "cache" {
  params = [repo]
  result = ["type=registry,ref=${REGISTRY}/${NAMESPACE}/cache:${repo}-${GPU_ARCH}${CACHE_TAG_SUFFIX}"]
}

function "cache_to" {
  params = [repo]
  result = ["type=registry,mode=max,ref=${REGISTRY}/${NAMESPACE}/cache:${repo}-${GPU_ARCH}${CACHE_TAG_SUFFIX}"]
}

# Published inputs: what each target: context collapses to with PUBLISHED_INPUTS=1. Each must
# track the tags of the target it mirrors; `rocm-assets check` fails when one drifts.
PUB_ROCM    = img("rocm-runtime", ROCM_TAG)
PUB_BASE    = img("pytorch-base", ROCM_TAG)
PUB_SRC     = img("pytorch-src", SDE_PYTORCH_VERSION)
PUB_TRITON  = img("triton-wheel", "${SDE_TRITON_VERSION}-rocm${SDE_ROCM_VERSION}")
PUB_CUPY    = img("cupy-wheel", TORCH_TAG)
PUB_PYTORCH = img("pytorch", TORCH_TAG)
PUB_AITER   = img("aiter-wheel", TORCH_TAG)
PUB_TV      = img("torchvision-wheel", TORCH_TAG)
PUB_NIXL    = img("nixl-wheel", TORCH_TAG)
PUB_LMCACHE = img("lmcache", TORCH_TAG)
PUB_LMCW    = img("lmcache-wheel", TORCH_TAG)
PUB_VLLM    = img("vllm", TORCH_TAG)

# ---------------------------------------------------------------------------------------------
target "_common" {
  context    = "."
  platforms  = ["linux/amd64"]
  args = {
    GPU_ARCH         = GPU_ARCH
    MAX_JOBS         = MAX_JOBS
    SCCACHE_LOG      = SCCACHE_LOG
    RUN_ID           = RUN_ID
    ROCM_VERSION     = SDE_ROCM_VERSION
    PYTHON_VERSION   = SDE_PYTHON_VERSION
    PYTORCH_VERSION  = SDE_PYTORCH_VERSION
  }
}

# ROCm userspace from AMD's image, pruned to the one arch this build is for.
target "rocm-runtime" {
  inherits   = ["_common"]
  dockerfile = "docker/rocm-runtime.Dockerfile"
  args = {
    ROCM_IMAGE          = "${SDE_ROCM_BASE_IMAGE}:${SDE_ROCM_VERSION}-full"
    BUILDKIT_BUILD_NAME = build_name("rocm-runtime", GPU_ARCH)
  }
  tags       = [img("rocm-runtime", ROCM_TAG)]
  cache-from = cache("rocm-runtime")
  cache-to   = cache_to("rocm-runtime")
}

target "pytorch-base" {
  inherits   = ["_common"]
  dockerfile = "docker/pytorch-base.Dockerfile"
  contexts = USE_PUB ? {} : {
    "rocm-runtime" = "target:rocm-runtime"
  }
  args = {
    RUNTIME_IMAGE       = USE_PUB ? PUB_ROCM : "rocm-runtime"
    BUILDKIT_BUILD_NAME = build_name("pytorch-base", GPU_ARCH)
  }
  tags       = [img("pytorch-base", ROCM_TAG)]
  cache-from = cache("pytorch-base")
  cache-to   = cache_to("pytorch-base")
}

# PyTorch sources with submodules: no compiler, no arch.
target "pytorch-src" {
  inherits   = ["_common"]
  dockerfile = "docker/pytorch-src.Dockerfile"
  args = {
    PYTORCH_REF         = SDE_PYTORCH_REF
    BUILDKIT_BUILD_NAME = build_name("pytorch-src", "noarch")
  }
  tags = [img("pytorch-src", SDE_PYTORCH_VERSION)]
}

# Triton needs cmake<4 and PyTorch pulls cmake 4.x, so it builds from the base, beside PyTorch.
# Triton JIT-compiles for any arch: the only wheel without an arch in its tag.
target "triton-wheel" {
  inherits   = ["_common"]
  dockerfile = "docker/triton-wheel.Dockerfile"
  contexts = USE_PUB ? {} : {
    "pytorch-base" = "target:pytorch-base"
  }
  args = {
    BASE_IMAGE          = USE_PUB ? PUB_BASE : "pytorch-base"
    TRITON_REF          = SDE_TRITON_REF
    BUILDKIT_BUILD_NAME = build_name("triton-wheel", "noarch")
  }
  tags = [img("triton-wheel", "${SDE_TRITON_VERSION}-rocm${SDE_ROCM_VERSION}")]
}

# CuPy has no torch dependency; LMCache's MP server imports it at module scope, so it is required.
target "cupy-wheel" {
  inherits   = ["_common"]
  dockerfile = "docker/cupy-wheel.Dockerfile"
  contexts = USE_PUB ? {} : {
    "pytorch-base" = "target:pytorch-base"
  }
  args = {
    BASE_IMAGE          = USE_PUB ? PUB_BASE : "pytorch-base"
    CUPY_REF            = SDE_CUPY_REF
    BUILDKIT_BUILD_NAME = build_name("cupy-wheel", GPU_ARCH)
  }
  tags = [img("cupy-wheel", TORCH_TAG)]
}

target "pytorch" {
  inherits   = ["_common"]
  dockerfile = "docker/pytorch.Dockerfile"
  contexts = USE_PUB ? {} : {
    "pytorch-src"  = "target:pytorch-src"
    "pytorch-base" = "target:pytorch-base"
    "triton-wheel" = "target:triton-wheel"
  }
  args = {
    SRC_IMAGE           = USE_PUB ? PUB_SRC : "pytorch-src"
    BASE_IMAGE          = USE_PUB ? PUB_BASE : "pytorch-base"
    TRITON_WHEEL_IMAGE  = USE_PUB ? PUB_TRITON : "triton-wheel"
    BUILDKIT_BUILD_NAME = build_name("pytorch", GPU_ARCH)
  }
  tags       = [img("pytorch", TORCH_TAG)]
  cache-from = cache("pytorch")
  cache-to   = cache_to("pytorch")
}

target "pytorch-wheel" {
  inherits   = ["_common"]
  dockerfile = "docker/pytorch-wheel.Dockerfile"
  contexts = USE_PUB ? {} : {
    "pytorch-src" = "target:pytorch-src"
    "pytorch"     = "target:pytorch"
  }
  args = {
    SRC_IMAGE           = USE_PUB ? PUB_SRC : "pytorch-src"
    PYTORCH_IMAGE       = USE_PUB ? PUB_PYTORCH : "pytorch"
    BUILDKIT_BUILD_NAME = build_name("pytorch-wheel", GPU_ARCH)
  }
  tags = [img("pytorch-wheel", TORCH_TAG)]
}

# The runtime image. Its pytorch input must resolve in both modes, so it is a docker-image://
# context rather than a target: one. Outside `default`: no node has a usable GPU to exercise it.
target "pytorch-run" {
  inherits   = ["_common"]
  dockerfile = "docker/pytorch-run.Dockerfile"
  contexts = merge(USE_PUB ? {} : { "rocm-runtime" = "target:rocm-runtime" }, {
    "pytorch" = "docker-image://${PUB_PYTORCH}"
  })
  args = {
    RUNTIME_IMAGE       = USE_PUB ? PUB_ROCM : "rocm-runtime"
    PYTORCH_IMAGE       = "pytorch"
    BUILDKIT_BUILD_NAME = build_name("pytorch-run", GPU_ARCH)
  }
  tags = [img("pytorch-run", TORCH_TAG)]
}

# Exits 1 when torch.cuda.is_available() is false, and a BuildKit RUN step has no /dev/kfd:
# it runs on a GPU node as an asset check on pytorch, never inside the build graph.
target "pytorch-test" {
  inherits   = ["_common"]
  dockerfile = "docker/pytorch-test.Dockerfile"
  contexts = USE_PUB ? {} : {
    "pytorch" = "target:pytorch"
  }
  args = {
    PYTORCH_IMAGE       = USE_PUB ? PUB_PYTORCH : "pytorch"
    BUILDKIT_BUILD_NAME = build_name("pytorch-test", GPU_ARCH)
  }
  tags = [img("pytorch-test", TORCH_TAG)]
}

target "aiter-wheel" {
  inherits   = ["_common"]
  dockerfile = "docker/aiter-wheel.Dockerfile"
  contexts = USE_PUB ? {} : {
    "pytorch"      = "target:pytorch"
    "triton-wheel" = "target:triton-wheel"
  }
  args = {
    PYTORCH_IMAGE       = USE_PUB ? PUB_PYTORCH : "pytorch"
    TRITON_WHEEL_IMAGE  = USE_PUB ? PUB_TRITON : "triton-wheel"
    AITER_REF           = SDE_AITER_REF
    BUILDKIT_BUILD_NAME = build_name("aiter-wheel", GPU_ARCH)
  }
  tags = [img("aiter-wheel", TORCH_TAG)]
}

# setup.py imports torch to decide it is building for ROCm, so it builds on pytorch.
target "torchvision-wheel" {
  inherits   = ["_common"]
  dockerfile = "docker/torchvision-wheel.Dockerfile"
  contexts = USE_PUB ? {} : {
    "pytorch" = "target:pytorch"
  }
  args = {
    PYTORCH_IMAGE       = USE_PUB ? PUB_PYTORCH : "pytorch"
    TORCHVISION_REF     = SDE_TORCHVISION_REF
    BUILDKIT_BUILD_NAME = build_name("torchvision-wheel", GPU_ARCH)
  }
  tags = [img("torchvision-wheel", TORCH_TAG)]
}

# NIXL plus UCX built from source.
target "nixl-wheel" {
  inherits   = ["_common"]
  dockerfile = "docker/nixl-wheel.Dockerfile"
  contexts = USE_PUB ? {} : {
    "pytorch" = "target:pytorch"
  }
  args = {
    PYTORCH_IMAGE       = USE_PUB ? PUB_PYTORCH : "pytorch"
    UCX_REF             = SDE_UCX_REF
    NIXL_REF            = SDE_NIXL_REF
    BUILDKIT_BUILD_NAME = build_name("nixl-wheel", GPU_ARCH)
  }
  tags = [img("nixl-wheel", TORCH_TAG)]
}

# Cache movement, not GEMMs: no AITER context.
target "lmcache" {
  inherits   = ["_common"]
  dockerfile = "docker/lmcache.Dockerfile"
  contexts = USE_PUB ? {} : {
    "pytorch"      = "target:pytorch"
    "triton-wheel" = "target:triton-wheel"
    "nixl-wheel"   = "target:nixl-wheel"
    "cupy-wheel"   = "target:cupy-wheel"
  }
  args = {
    PYTORCH_IMAGE       = USE_PUB ? PUB_PYTORCH : "pytorch"
    TRITON_WHEEL_IMAGE  = USE_PUB ? PUB_TRITON : "triton-wheel"
    NIXL_WHEEL_IMAGE    = USE_PUB ? PUB_NIXL : "nixl-wheel"
    CUPY_WHEEL_IMAGE    = USE_PUB ? PUB_CUPY : "cupy-wheel"
    LMCACHE_REF         = SDE_LMCACHE_REF
    BUILDKIT_BUILD_NAME = build_name("lmcache", GPU_ARCH)
  }
  tags = [img("lmcache", TORCH_TAG)]
}

target "lmcache-wheel" {
  inherits   = ["_common"]
  dockerfile = "docker/lmcache-wheel.Dockerfile"
  contexts = USE_PUB ? {} : {
    "lmcache" = "target:lmcache"
  }
  args = {
    LMCACHE_IMAGE       = USE_PUB ? PUB_LMCACHE : "lmcache"
    BUILDKIT_BUILD_NAME = build_name("lmcache-wheel", GPU_ARCH)
  }
  tags = [img("lmcache-wheel", TORCH_TAG)]
}

# vLLM imports lmcache.utils from the wheel, and timm -> torchvision must be the ROCm build.
target "vllm" {
  inherits   = ["_common"]
  dockerfile = "docker/vllm.Dockerfile"
  contexts = USE_PUB ? {} : {
    "pytorch"           = "target:pytorch"
    "triton-wheel"      = "target:triton-wheel"
    "aiter-wheel"       = "target:aiter-wheel"
    "nixl-wheel"        = "target:nixl-wheel"
    "lmcache-wheel"     = "target:lmcache-wheel"
    "torchvision-wheel" = "target:torchvision-wheel"
  }
  args = {
    PYTORCH_IMAGE           = USE_PUB ? PUB_PYTORCH : "pytorch"
    TRITON_WHEEL_IMAGE      = USE_PUB ? PUB_TRITON : "triton-wheel"
    AITER_WHEEL_IMAGE       = USE_PUB ? PUB_AITER : "aiter-wheel"
    NIXL_WHEEL_IMAGE        = USE_PUB ? PUB_NIXL : "nixl-wheel"
    LMCACHE_WHEEL_IMAGE     = USE_PUB ? PUB_LMCW : "lmcache-wheel"
    TORCHVISION_WHEEL_IMAGE = USE_PUB ? PUB_TV : "torchvision-wheel"
    VLLM_REF                = SDE_VLLM_REF
    BUILDKIT_BUILD_NAME     = build_name("vllm", GPU_ARCH)
  }
  tags       = [img("vllm", TORCH_TAG)]
  cache-from = cache("vllm")
  cache-to   = cache_to("vllm")
}

target "vllm-wheel" {
  inherits   = ["_common"]
  dockerfile = "docker/vllm-wheel.Dockerfile"
  contexts = USE_PUB ? {} : {
    "vllm" = "target:vllm"
  }
  # VLLM_REF labels the wheel image with the vLLM it holds: a pin bump redefines both targets.
  args = {
    VLLM_IMAGE          = USE_PUB ? PUB_VLLM : "vllm"
    VLLM_REF            = SDE_VLLM_REF
    BUILDKIT_BUILD_NAME = build_name("vllm-wheel", GPU_ARCH)
  }
  tags = [img("vllm-wheel", TORCH_TAG)]
}

# ---------------------------------------------------------------------------------------------
# No `all` group: pytorch-test and pytorch-run stay outside default on purpose (see above).
group "default" {
  targets = [
    "rocm-runtime", "pytorch-src", "pytorch-base", "pytorch", "pytorch-wheel", "triton-wheel",
    "aiter-wheel", "torchvision-wheel", "cupy-wheel", "nixl-wheel", "vllm", "vllm-wheel",
    "lmcache", "lmcache-wheel",
  ]
}

group "wheels" {
  targets = [
    "pytorch-wheel", "triton-wheel", "aiter-wheel", "nixl-wheel", "torchvision-wheel",
    "cupy-wheel", "vllm-wheel", "lmcache-wheel",
  ]
}

group "serving" {
  targets = [
    "torchvision-wheel", "cupy-wheel", "nixl-wheel", "vllm", "vllm-wheel", "lmcache",
    "lmcache-wheel",
  ]
}
