"""`python -m rocm_assets.cli`: the same as the `rocm-assets` script."""

from rocm_assets.cli.main import entry

entry()
