"""`rocm-assets best`: never a node nobody could probe without saying so.

Real: the `rocm-assets` console script in a subprocess, probing Debian's OpenSSH sshd (the
`sshd_server` fixture, canned /proc per node) and closed loopback ports; nodes with no ssh
address are never probed.
"""

import json
import os
import shutil
from pathlib import Path

import pytest

from rocm_assets_tests.helpers import free_port, rocm_assets_cli, write_fleet
from rocm_assets_tests.servers.sshd import SshdServer

NOT_PROBED = "fleet figures, not probed: no ssh address, so its load now is unknown"


def probe_env(sshd: SshdServer, tmp_path: Path) -> dict[str, str]:
    """paramiko takes the default key from ~/.ssh; the host keys come from ROCM_SSH_KNOWN_HOSTS."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(sshd.client_key, home / ".ssh" / "id_ed25519")
    os.chmod(home / ".ssh" / "id_ed25519", 0o600)
    return {**os.environ, "HOME": str(home), "ROCM_SSH_KNOWN_HOSTS": str(sshd.known_hosts)}


CLOUD = {"name": "cloud", "cores": 48, "mem_gb": 96.0}


@pytest.mark.real
def test_an_unprobed_node_that_wins_says_so_and_names_the_best_probed(
    sshd_server: SshdServer, tmp_path: Path
) -> None:
    fleet = write_fleet(
        tmp_path / "fleet.yaml",
        [
            {"name": "small", "builder": "small-builder", "ssh": sshd_server.ssh_address("small")},
            CLOUD,
        ],
        cores=8,
        mem_gb=16.0,
        link_mbps=100.0,
    )
    env = probe_env(sshd_server, tmp_path)
    text = rocm_assets_cli("best", "--fleet", str(fleet), env=env)
    assert text.returncode == 0, text.stderr
    # small: 8 GiB free + 4 idle cores, read over ssh; cloud: its fleet figures, all cores idle.
    assert text.stdout == (
        f"cloud: score 144.0 (96.0 GB free + 48.0 idle cores of 48; {NOT_PROBED}; "
        "the strongest probed node is small, score 12.0)\n"
    )
    data = json.loads(rocm_assets_cli("best", "--json", "--fleet", str(fleet), env=env).stdout)
    assert (data["node"], data["probed"], data["best_probed"]) == ("cloud", False, "small")


def test_when_every_probed_node_fails_none_is_picked(tmp_path: Path) -> None:
    dead = [free_port(), free_port()]
    fleet = write_fleet(
        tmp_path / "fleet.yaml",
        [{"name": f"dead{i}", "ssh": f"root@127.0.0.1:{port}"} for i, port in enumerate(dead)]
        + [CLOUD],
        cores=8,
        mem_gb=16.0,
        link_mbps=100.0,
    )
    out = rocm_assets_cli("best", "--fleet", str(fleet), env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.splitlines() == [
        f"rocm-assets: excluded dead0: ssh connection to root@127.0.0.1:{dead[0]} refused",
        f"rocm-assets: excluded dead1: ssh connection to root@127.0.0.1:{dead[1]} refused",
        f"rocm-assets: error: no node of {fleet} is reachable: dead0, dead1 failed their probes "
        "(reasons above); cloud has no ssh address, so nobody could probe it, and fleet figures "
        "are no live state to pick on",
    ]


def test_a_fleet_with_no_ssh_at_all_picks_on_fleet_figures_and_says_so(tmp_path: Path) -> None:
    fleet = write_fleet(
        tmp_path / "fleet.yaml",
        [{"name": "laptop", "cores": 4, "mem_gb": 8.0}, CLOUD],
        link_mbps=100.0,
    )
    out = rocm_assets_cli("best", "--fleet", str(fleet))
    assert out.returncode == 0, out.stderr
    assert (
        out.stdout == f"cloud: score 144.0 (96.0 GB free + 48.0 idle cores of 48; {NOT_PROBED})\n"
    )
    data = json.loads(rocm_assets_cli("best", "--json", "--fleet", str(fleet)).stdout)
    assert (data["node"], data["probed"], data["best_probed"]) == ("cloud", False, None)
