"""A build node that is a separate host: probed and built on over SSH, as the farm does.

Real, all of it: the node (rocm_assets_tests/servers/netns.py) is a network namespace of its own
behind a veth pair, running its own OpenSSH sshd and its own dockerd 26; the project's fabric
probe (core/probes.py) logs in to it with host key checking against the node's generated
known_hosts; `bake_invocation` + `run_bake` (core/build.py) run a real `docker buildx bake`
(buildx 0.29) whose docker CLI reaches the node's engine through a docker context
`host=ssh://root@NODE` (the real ssh client, strict host key checking); the node's BuildKit
pushes to a real docker-registry on the host's side of the link; the history records are read
with real `docker buildx history ls`.
"""

import json
import os
import socket
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from rocm_assets.core.build.invocation import bake_invocation, build_name, history, run_bake
from rocm_assets.core.nodes.probes import probe_node
from rocm_assets_tests.servers.dockerd import place_busybox
from rocm_assets_tests.servers.netns import SSH_PORT, HostRegistry, RemoteNode

pytestmark = pytest.mark.real

TARGET = "hello"
ARCH = "gfx942"
REPO = "rocm-remote/hello"
_MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)

# The farm's conventions (examples/farm/bake.hcl): GPU_ARCHES as a variable, one GPU_ARCH per
# build, REGISTRY from the environment, history records named by BUILDKIT_BUILD_NAME (which
# bake_invocation also sets with --set).
BAKE_FILE = f"""\
variable "GPU_ARCHES" {{
  default = ["gfx942", "gfx1100"]
}}

variable "GPU_ARCH" {{
  default = "gfx942"
}}

variable "REGISTRY" {{
  default = "127.0.0.1:5000"
}}

variable "PUBLISHED_INPUTS" {{
  default = false
}}

variable "RUN_ID" {{
  default = "dev"
}}

variable "MAX_JOBS" {{
  default = ""
}}

function "build_name" {{
  params = [target, arch]
  result = "rocm-pytorch-build/${{target}}/${{arch}}/${{RUN_ID}}"
}}

target "{TARGET}" {{
  context    = "."
  dockerfile = "{TARGET}.Dockerfile"
  tags       = ["${{REGISTRY}}/{REPO}:${{GPU_ARCH}}-${{RUN_ID}}"]
  args = {{
    GPU_ARCH            = GPU_ARCH
    RUN_ID              = RUN_ID
    MAX_JOBS            = MAX_JOBS
    BUILDKIT_BUILD_NAME = build_name("{TARGET}", GPU_ARCH)
  }}
}}
"""

# FROM scratch plus Debian's static busybox: a RUN step runs a container on the node's engine.
DOCKERFILE = """\
FROM scratch
ARG GPU_ARCH
ARG RUN_ID
LABEL org.rocm.remote.arch="${GPU_ARCH}" org.rocm.remote.run-id="${RUN_ID}"
COPY busybox /bin/busybox
RUN --network=none ["/bin/busybox", "sh", "-c", "echo \\"$GPU_ARCH\\" > /arch"]
"""


def _mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024**2
    raise AssertionError("no MemAvailable in /proc/meminfo")


def test_probe_reads_the_node_over_ssh_with_its_host_key_checked(
    remote_node: RemoteNode, tmp_path: Path
) -> None:
    node = remote_node.fleet_node()
    probe = probe_node(
        node,
        timeout_s=10.0,
        sample_s=0.2,
        connect_kwargs=remote_node.connect_kwargs(),
        known_hosts=remote_node.known_hosts,
    )
    assert probe.ok, f"{probe.reason}\n{remote_node.log_tail()}"
    assert probe.probed and probe.builder_ok
    # The node is a namespace on this kernel: its nproc and MemAvailable are this machine's.
    assert probe.cores == len(os.sched_getaffinity(0))
    here = _mem_available_gib()
    assert abs(probe.mem_available_gb - here) <= max(1.0, 0.25 * here), (probe, here)
    assert 0.0 <= probe.idle_cores <= probe.cores
    # It logged in over the link, from the host's side of it.
    assert f"Accepted publickey for root from {remote_node.host_addr}" in (
        remote_node.sshd_log.read_text()
    )

    # Checked, not trusted: a known_hosts that does not list the node refuses it.
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    refused = probe_node(
        node,
        timeout_s=10.0,
        sample_s=0.2,
        connect_kwargs=remote_node.connect_kwargs(),
        known_hosts=empty,
    )
    assert not refused.ok
    assert refused.reason == f"host key of {remote_node.ssh_address} not in known_hosts"


def test_docker_cli_ssh_checks_the_node_host_key(remote_node: RemoteNode, tmp_path: Path) -> None:
    # The ssh the docker CLI runs (the wrapper first on the env's PATH) refuses a node that its
    # known_hosts does not list; a command-line -o wins over the wrapper's -F file.
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    done = subprocess.run(
        ["ssh", "-o", f"UserKnownHostsFile={empty}", remote_node.ssh_address, "true"],
        env=remote_node.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 255
    assert "Host key verification failed" in done.stderr
    # Nothing was learnt on the way: the user's own known_hosts never lists the node.
    users = Path.home() / ".ssh" / "known_hosts"
    assert not users.is_file() or remote_node.node_addr not in users.read_text()


def test_link_cut_and_restored(remote_node: RemoteNode) -> None:
    # While the node's end is down, nothing answers (no refusal, no reset): a connect times out.
    with remote_node.link_cut():
        assert not remote_node.link_is_up()
        with pytest.raises(TimeoutError):
            socket.create_connection((remote_node.node_addr, SSH_PORT), timeout=1.0).close()
    assert remote_node.link_is_up()
    # Up again, the builder answers over SSH as before.
    done = subprocess.run(
        ["docker", "--context", remote_node.builder, "version", "--format", "{{.Server.Version}}"],
        env=remote_node.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_bake_on_the_node_over_ssh_pushes_to_the_hosts_registry(
    remote_node: RemoteNode, remote_registry: HostRegistry, tmp_path: Path
) -> None:
    (tmp_path / "bake.hcl").write_text(BAKE_FILE)
    (tmp_path / f"{TARGET}.Dockerfile").write_text(DOCKERFILE)
    place_busybox(tmp_path)
    run_id = f"r{uuid.uuid4().hex[:8]}"
    builder = remote_node.builder
    inv = bake_invocation(
        bake_file=tmp_path / "bake.hcl",
        target=TARGET,
        arch=ARCH,
        partition=ARCH,
        builder=builder,
        max_jobs=2,
        run_id=run_id,
        metadata_file=tmp_path / "metadata.json",
        base_env={**remote_node.env, "REGISTRY": remote_node.registry_host},
    )
    # builder_env found the ssh context: real buildx refuses `--builder CTX` otherwise.
    assert inv.env["DOCKER_CONTEXT"] == builder
    output: list[str] = []
    result = run_bake(inv, on_output=output.extend)

    tag = f"{remote_node.registry_host}/{REPO}:{ARCH}-{run_id}"
    assert result.tags == (tag,)
    metadata = json.loads(inv.metadata_file.read_text())[TARGET]
    assert metadata["containerimage.digest"] == result.digest
    assert metadata["buildx.build.ref"].startswith(f"{builder}/{builder}/")

    # The image is in the registry on the host's side of the link, under the built digest.
    response = httpx.head(
        f"{remote_registry.url}/v2/{REPO}/manifests/{ARCH}-{run_id}",
        headers={"Accept": _MANIFEST_TYPES},
        trust_env=False,
        timeout=10.0,
    )
    assert response.status_code == 200, remote_registry.log_tail()
    assert response.headers["Docker-Content-Digest"] == result.digest

    # The builder's history (read over SSH, as the farm reads it) names the build.
    name = build_name(TARGET, ARCH, run_id)
    assert name == f"rocm-pytorch-build/{TARGET}/{ARCH}/{run_id}"
    records = [r for r in history(builder, remote_node.env) if r.name == name]
    assert len(records) == 1, output[-20:]
    ref = result.history_ref.rsplit("/", 1)[-1]
    assert records[0].ref.rsplit("/", 1)[-1] == ref

    # The build ran on the node's engine: its own socket (no SSH) shows the record and the image,
    # and that dockerd lives in the node's network namespace, not the host's.
    on_node = [
        json.loads(line)
        for line in remote_node.node_docker("buildx", "history", "ls", "--format", "json")
        .strip()
        .splitlines()
    ]
    assert [r["name"] for r in on_node if r["ref"].rsplit("/", 1)[-1] == ref] == [name]
    labels = json.loads(
        remote_node.node_docker("image", "inspect", "--format", "{{json .Config.Labels}}", tag)
    )
    assert labels == {"org.rocm.remote.arch": ARCH, "org.rocm.remote.run-id": run_id}
    assert remote_node.runs_in_node(remote_node.dockerd_pid())
    assert not remote_node.runs_in_node(os.getpid())
    # The CLI reached it through sshd on the node, from the host's side of the link.
    assert f"Accepted publickey for root from {remote_node.host_addr}" in (
        remote_node.sshd_log.read_text()
    )
