# The example farm `make demo` builds: five tiny targets shaped like rocm-bake.hcl's graph, with its
# conventions, so the farm's whole path (placement, one bake per build, the registry, the sensor)
# runs in minutes on one machine:
#
#   runtime --> base --> torch --> torch-wheel      a chain, per arch (like rocm-runtime ... pytorch)
#   src ---------------> torch                      a noarch target (like pytorch-src), and a join
#
# Every image is FROM scratch or built here, so nothing is pulled from the internet. The roots copy
# in Debian's static busybox (`make demo` puts it beside this file, as `busybox`), so each build
# has a RUN step that holds its node HOLD_S seconds and the placement shows.
#
#   rocm-assets check --bake-file examples/farm/bake.hcl      # this file against its Dockerfiles
#   rocm-assets graph --bake-file examples/farm/bake.hcl
#
# Paths are relative to the directory bake runs in, as in real bake: the farm runs it from here.

# Two arches: two partitions, and a backfill of both shows two builds of each per-arch target.
variable "GPU_ARCHES" {
  default = ["gfx942", "gfx1100"]
}

variable "GPU_ARCH" {
  default = "gfx942"
}

# `make demo` points it at its local registry.
variable "REGISTRY" {
  default = "127.0.0.1:5000"
}

variable "NAMESPACE" {
  default = "rocm-demo"
}

# A bool default makes env PUBLISHED_INPUTS=1 parse as true, as in rocm-bake.hcl.
variable "PUBLISHED_INPUTS" {
  default = false
}

variable "RUN_ID" {
  default = "dev"
}

variable "MAX_JOBS" {
  default = ""
}

# Seconds each build holds its node (a busybox sleep); torch, the long pole, holds three times as
# long. A number: env HOLD_S=10 parses as one.
variable "HOLD_S" {
  default = 3
}

# The sources' pin, as rocm-bake.hcl's SDE_* refs: bump it (env SDE_SRC_REF=v2) and src, then
# torch and torch-wheel of every arch, are out of date; runtime and base are not.
variable "SDE_SRC_REF" {
  default = "v1"
}

USE_PUB = PUBLISHED_INPUTS
ARCH_TAG = "1.0-${GPU_ARCH}"

function "img" {
  params = [repo, tag]
  result = "${REGISTRY}/${NAMESPACE}/${repo}:${tag}"
}

function "build_name" {
  params = [target, arch]
  result = "rocm-pytorch-build/${target}/${arch}/${RUN_ID}"
}

# What each target: context collapses to with PUBLISHED_INPUTS=1 (the farm's mode): the tag of
# the target it mirrors. `rocm-assets check` fails when one drifts.
PUB_RUNTIME = img("runtime", ARCH_TAG)
PUB_BASE    = img("base", ARCH_TAG)
PUB_SRC     = img("src", "1.0")
PUB_TORCH   = img("torch", ARCH_TAG)

target "_common" {
  context = "."
  args = {
    GPU_ARCH = GPU_ARCH
    MAX_JOBS = MAX_JOBS
    RUN_ID   = RUN_ID
    HOLD_S   = HOLD_S
  }
}

target "runtime" {
  inherits   = ["_common"]
  dockerfile = "docker/runtime.Dockerfile"
  args = {
    BUILDKIT_BUILD_NAME = build_name("runtime", GPU_ARCH)
  }
  tags = [img("runtime", ARCH_TAG)]
}

target "base" {
  inherits   = ["_common"]
  dockerfile = "docker/base.Dockerfile"
  contexts = USE_PUB ? {} : {
    "runtime" = "target:runtime"
  }
  args = {
    RUNTIME_IMAGE       = USE_PUB ? PUB_RUNTIME : "runtime"
    BUILDKIT_BUILD_NAME = build_name("base", GPU_ARCH)
  }
  tags = [img("base", ARCH_TAG)]
}

# No arch in its tag: built once, for every arch.
target "src" {
  inherits   = ["_common"]
  dockerfile = "docker/src.Dockerfile"
  args = {
    SRC_REF             = SDE_SRC_REF
    BUILDKIT_BUILD_NAME = build_name("src", "noarch")
  }
  tags = [img("src", "1.0")]
}

# The join: the arch's base plus the noarch sources.
target "torch" {
  inherits   = ["_common"]
  dockerfile = "docker/torch.Dockerfile"
  contexts = USE_PUB ? {} : {
    "src"  = "target:src"
    "base" = "target:base"
  }
  args = {
    SRC_IMAGE           = USE_PUB ? PUB_SRC : "src"
    BASE_IMAGE          = USE_PUB ? PUB_BASE : "base"
    HOLD_S              = HOLD_S * 3
    BUILDKIT_BUILD_NAME = build_name("torch", GPU_ARCH)
  }
  tags = [img("torch", ARCH_TAG)]
}

target "torch-wheel" {
  inherits   = ["_common"]
  dockerfile = "docker/torch-wheel.Dockerfile"
  contexts = USE_PUB ? {} : {
    "torch" = "target:torch"
  }
  args = {
    TORCH_IMAGE         = USE_PUB ? PUB_TORCH : "torch"
    BUILDKIT_BUILD_NAME = build_name("torch-wheel", GPU_ARCH)
  }
  tags = [img("torch-wheel", ARCH_TAG)]
}

group "default" {
  targets = ["runtime", "base", "src", "torch", "torch-wheel"]
}

group "wheels" {
  targets = ["torch-wheel"]
}
