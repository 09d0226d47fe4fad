"""Shared fixtures. Real servers live in rocm_assets_tests/servers/, registered as plugins."""

from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = [
    "rocm_assets_tests.servers.registry",
    "rocm_assets_tests.servers.sshd",
    "rocm_assets_tests.servers.dockerd",
    "rocm_assets_tests.servers.postgres",
]


@pytest.fixture
def project_root() -> Path:
    return PROJECT_ROOT
