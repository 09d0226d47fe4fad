"""The two buildx binaries the differential tests compare the builtin resolver against.

Real: Debian testing's buildx (0.29 or later) and Debian 13's 0.13, as .ci/setup installs them.
"""

from rocm_assets_tests.helpers.bake_oracle import buildx_binaries


def test_buildx_binaries_are_the_two_versions() -> None:
    new, old = (b.version for b in buildx_binaries())
    assert new >= (0, 29, 0)
    assert old[:2] == (0, 13)
