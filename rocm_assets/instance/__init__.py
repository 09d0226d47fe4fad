"""The instance plugin: the run coordinator and what it needs from Dagster's instance.

Loaded by the webserver, the daemon and the CLI from dagster.yaml, so it must import quickly and
never import `rocm_assets.defs` or `rocm_assets.cli` (the code location may not even be
importable in those processes). It may import `rocm_assets.core` and Dagster. Private Dagster
APIs that only this plugin needs are confined to `rocm_assets.instance.dagster_internals`.
"""
