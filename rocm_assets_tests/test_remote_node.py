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
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from rocm_assets.core.build.guard import GRACE_S
from rocm_assets.core.build.invocation import (
    BuildError,
    bake_invocation,
    build_name,
    history,
    run_bake,
)
from rocm_assets.core.nodes.fleet import Node
from rocm_assets.core.nodes.probes import NodeProbe, probe_node
from rocm_assets.core.nodes.watch import LinkWatch
from rocm_assets_tests.helpers import alive, wait_until
from rocm_assets_tests.servers.dockerd import copy_e2e, place_busybox
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


# ##### A CUT LINK, SEEN BY THE FARM'S OWN PROBE

# The watch's figures for these tests; the farm's own are 10 s and 45 s (core/nodes/watch.py).
WATCH_EVERY_S = 2.0
WATCH_UNREACHABLE_S = 10.0
SHORT_CUT_S = 5.0
# A probe's own bound: 5 s per connection phase plus its 0.5 s sample.
PROBE_BOUND_S = 5.5


def _unanswered(remote_node: RemoteNode) -> str:
    """The probe's reason for a cut link: its connect times out, or the host's neighbour lookup
    gives up first (the node's end of the link is down)."""
    address = re.escape(remote_node.ssh_address)
    return rf"(?:ssh timeout after 5 s|ssh connect to {address} failed: No route to host)"


def _processes_naming(text: str) -> list[int]:
    """Live processes with `text` in their command line (a bake names its build)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes() if proc.name.isdigit() else b""
        except OSError:
            continue
        if text.encode() in argv and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def _watch(remote_node: RemoteNode) -> LinkWatch:
    def probe(node: Node) -> NodeProbe:
        return probe_node(
            node, connect_kwargs=remote_node.connect_kwargs(), known_hosts=remote_node.known_hosts
        )

    return LinkWatch(
        remote_node.fleet_node(),
        every_s=WATCH_EVERY_S,
        unreachable_s=WATCH_UNREACHABLE_S,
        probe=probe,
    )


def test_the_link_watch_lets_a_short_cut_pass_and_names_a_long_one(
    remote_node: RemoteNode,
) -> None:
    with _watch(remote_node) as watch:
        with remote_node.link_cut():
            time.sleep(SHORT_CUT_S)
        time.sleep(WATCH_UNREACHABLE_S)
        assert watch.verdict() is None
        with remote_node.link_cut():
            cut = time.monotonic()
            wait_until(
                lambda: watch.verdict() is not None,
                "the watch's verdict",
                WATCH_UNREACHABLE_S + WATCH_EVERY_S + 2 * PROBE_BOUND_S,
                poll_s=0.2,
            )
            took_s = time.monotonic() - cut
    assert re.fullmatch(
        rf"node {remote_node.name} unreachable for \d+ s \({_unanswered(remote_node)}\)",
        watch.verdict() or "",
    ), watch.verdict()
    assert took_s >= WATCH_UNREACHABLE_S


def test_a_bake_over_a_cut_link_ends_within_its_watchs_bound(
    remote_node: RemoteNode,
    remote_registry: HostRegistry,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    bake_file = copy_e2e(tmp_path / "e2e")
    run_id = f"r{uuid.uuid4().hex[:8]}"
    inv = bake_invocation(
        bake_file=bake_file,
        target="base",
        arch=ARCH,
        partition=ARCH,
        builder=remote_node.builder,
        max_jobs=1,
        run_id=run_id,
        metadata_file=tmp_path / "metadata.json",
        base_env={**remote_node.env, "REGISTRY": remote_node.registry_host, "HOLD_S": "300"},
    )

    def on_node() -> list[dict]:
        out = remote_node.node_docker("buildx", "history", "ls", "--format", "json")
        return [json.loads(line) for line in out.splitlines() if inv.name in line]

    seen: list[str] = []
    with _watch(remote_node) as watch:

        def on_output(batch: list[str]) -> None:
            # The held RUN step has started on the node: pull the cable.
            if not seen and any("sleep" in line for line in batch):
                seen.append("cut")
                remote_node.link_down()

        started = time.monotonic()
        try:
            with pytest.raises(BuildError) as raised:
                run_bake(inv, on_output=on_output, stop_when=watch.verdict)
            ended_s = time.monotonic() - started
            # Ended while the link was still down: nothing waited for it to heal.
            assert not remote_node.link_is_up()
        finally:
            remote_node.link_up()
    assert seen == ["cut"]
    assert re.fullmatch(
        rf"node {remote_node.name} unreachable for \d+ s \({_unanswered(remote_node)}\): bake "
        "was stopped",
        str(raised.value),
    ), raised.value
    # Silence, then the watch's bound, then the guard's grace for bake to stop: never minutes.
    assert ended_s <= WATCH_UNREACHABLE_S + WATCH_EVERY_S + PROBE_BOUND_S + GRACE_S + 10.0
    assert _processes_naming(inv.name) == []
    # With its client gone, BuildKit on the node ends the build once the link is back.
    healed = time.monotonic()
    wait_until(lambda: [r["status"] for r in on_node()] == ["Error"], "the build to end", 120)
    record_property("bake_ended_after_s", round(ended_s, 1))
    record_property("node_ended_it_after_heal_s", round(time.monotonic() - healed, 1))
