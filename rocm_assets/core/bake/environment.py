"""Which environment bake gets, and which of it bake reads: what a `--print` is run with, and
what its answer is keyed on (the cache, the manifest)."""

from collections.abc import Mapping

from rocm_assets.core.bake.source import Outline

# Environment bake reads besides the file's own variables.
_BAKE_ENV_PREFIXES = ("BUILDX_BAKE_", "BAKE_")
# What must not reach a --print: it would add files or a remote definition to the invocation.
_DROPPED_ENV = ("BUILDX_BAKE_FILE", "BUILDX_BAKE_PATH_SEPARATOR")


def print_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a `--print` runs with: all of `env` but what would change the invocation."""
    return {k: v for k, v in env.items() if k not in _DROPPED_ENV}


def bake_env(outline: Outline, env: Mapping[str, str]) -> dict[str, str]:
    """The environment values bake reads: the file's variables, bake's own settings, HOME."""
    return {
        k: v
        for k, v in env.items()
        if k in outline.variables or k.startswith(_BAKE_ENV_PREFIXES) or k == "HOME"
    }
