# rocm-assets passes this file to bake after the farm's own (`-f <bake file> -f arch_check.hcl`)
# when the installed buildx has variable validation (0.19 and later): bake itself then refuses a
# GPU_ARCH the file does not list. It is a file of its own because buildx before 0.19 rejects a
# `validation` block outright, and the farm's bake files must load there too; on those versions
# rocm-assets makes the same check itself. Run by hand: add `-f` with this file's path.
variable "ROCM_ASSETS_ARCH_CHECK" {
  default = GPU_ARCH
  validation {
    condition     = contains(GPU_ARCHES, GPU_ARCH)
    error_message = "GPU_ARCH must be one of GPU_ARCHES."
  }
}
