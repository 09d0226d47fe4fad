"""Shared fixtures. Real servers live in rocm_assets_tests/servers/, registered as plugins."""

from pathlib import Path

import pytest

from rocm_assets_tests.helpers import PROJECT_ROOT

pytest_plugins = [
    "rocm_assets_tests.servers.registry",
    "rocm_assets_tests.servers.hostile_registry",
    "rocm_assets_tests.servers.sshd",
    "rocm_assets_tests.servers.dockerd",
    "rocm_assets_tests.servers.netns",
    "rocm_assets_tests.servers.postgres",
    "rocm_assets_tests.helpers.instance",
]


@pytest.fixture
def project_root() -> Path:
    return PROJECT_ROOT
