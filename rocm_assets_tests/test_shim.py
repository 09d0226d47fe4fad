"""The test Docker engine and the `docker` shim that stands in for buildx.

Real parts: dockerd (Debian docker.io, vfs) started by the `dockerd` fixture, BuildKit builds run
by the real docker client, Debian's docker-registry (`registry_server`) receiving the pushes and
answering the digest checks, and the project's bake evaluator reading fixtures/e2e/bake.hcl. Only
buildx is stood in for. The start-failure test runs a real dockerd that cannot bind its socket.
The recording-mode and signal tests run no engine: they check the shim's own command line,
metadata and history handling, with a stand-in docker client where a child is needed.
"""

import base64
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from rocm_assets_tests.servers.dockerd import (
    E2E_BAKE_FILE,
    E2E_DIR,
    SHIM_BUILDER,
    Dockerd,
    DockerdError,
    DockerShim,
    RecordingShim,
    remove_root,
    start_dockerd,
)
from rocm_assets_tests.servers.registry import RegistryServer

ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)
REF = re.compile(rf"^{SHIM_BUILDER}/{SHIM_BUILDER}0/[0-9a-z]{{25}}$")
# Guards against a hung child, not timings: vfs builds of these images take seconds.
HANG_GUARD_S = 300


def docker(env: dict[str, str], *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run `docker` as the build code does: resolved on PATH (the shim), from the e2e directory."""
    return subprocess.run(
        ["docker", *args],
        env={**env, **extra},
        cwd=E2E_DIR,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )


def bake(
    env: dict[str, str], metadata: Path, *args: str, **extra: str
) -> subprocess.CompletedProcess[str]:
    return docker(
        env,
        "buildx", "bake", "-f", str(E2E_BAKE_FILE), "--builder", SHIM_BUILDER, "--push",
        "--metadata-file", str(metadata), *args,
        **extra,
    )  # fmt: skip


def history(env: dict[str, str], *filters: str) -> list[dict]:
    args = [f"--filter={f}" for f in filters]
    listed = docker(
        env, "buildx", "history", "ls", "--builder", SHIM_BUILDER, "--format", "json", *args
    )
    assert listed.returncode == 0, listed.stderr
    return [json.loads(line) for line in listed.stdout.splitlines()]


def manifest(registry: RegistryServer, repo: str, tag: str) -> httpx.Response:
    return httpx.get(
        f"{registry.url}/v2/{repo}/manifests/{tag}", headers={"Accept": ACCEPT}, trust_env=False
    )


def registry_digest(registry: RegistryServer, repo: str, tag: str) -> str | None:
    head = httpx.head(
        f"{registry.url}/v2/{repo}/manifests/{tag}", headers={"Accept": ACCEPT}, trust_env=False
    )
    if head.status_code == 404:
        return None
    head.raise_for_status()
    return head.headers["Docker-Content-Digest"]


# ##### ENGINE


@pytest.mark.real
def test_dockerd_answers_through_the_shim_and_trusts_loopback_registries(
    dockerd: Dockerd, docker_shim: DockerShim
) -> None:
    cidrs = docker(
        docker_shim.env, "info", "--format", "{{json .RegistryConfig.InsecureRegistryCIDRs}}"
    )
    # Pushes to the plain-HTTP registry on 127.0.0.1 rely on this default.
    assert cidrs.returncode == 0, cidrs.stderr
    assert "127.0.0.0/8" in json.loads(cidrs.stdout)
    assert docker_shim.env["DOCKER_HOST"] == dockerd.host
    version = docker(docker_shim.env, "buildx", "version")
    assert version.returncode == 0
    assert version.stdout.startswith("github.com/docker/buildx v")


@pytest.mark.real
def test_dockerd_that_cannot_start_fails_with_its_log_tail(tmp_path: Path) -> None:
    # A socket path beyond the 108-byte limit makes the real dockerd exit at start-up.
    root = Path(tempfile.mkdtemp(prefix="rocm-dockerd-" + "x" * 120))
    try:
        with pytest.raises(DockerdError, match=r"dockerd exited with status \d+ at start-up") as e:
            start_dockerd(root, tmp_path / "dockerd.log")
    finally:
        remove_root(root)
    # The message carries dockerd's own words about the socket it could not create.
    assert f"{root}/docker.sock" in str(e.value)


# ##### REAL BUILDS


@pytest.mark.real
def test_bake_builds_pushes_and_reports_the_registry_digest(
    docker_shim: DockerShim, registry_server: RegistryServer, tmp_path: Path
) -> None:
    prefix = registry_server.new_repo("shim")
    metadata = tmp_path / "metadata.json"
    name = "rocm-pytorch-build/base/gfx1100/run 7"
    built = bake(
        docker_shim.env, metadata, "--progress=plain",
        "--set", f"base.args.BUILDKIT_BUILD_NAME={name}", "--set", "base.args.MAX_JOBS=3", "base",
        PUBLISHED_INPUTS="1", GPU_ARCH="gfx1100", RUN_ID="run-7",
        REGISTRY=f"{registry_server.host}/{prefix}",
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    tags = [f"{prefix}/e2e/base:gfx1100", f"{prefix}/e2e/base:gfx1100-run-7"]
    # The build's own progress reached stderr.
    assert f"naming to {registry_server.host}/{tags[0]}" in built.stderr

    entry = json.loads(metadata.read_text())["base"]
    assert REF.match(entry["buildx.build.ref"])
    assert entry["image.name"] == ",".join(f"{registry_server.host}/{t}" for t in tags)
    for tag in tags:
        repo, _, ref = tag.rpartition(":")
        assert registry_digest(registry_server, repo, ref) == entry["containerimage.digest"]
    got = manifest(registry_server, f"{prefix}/e2e/base", "gfx1100")
    assert entry["containerimage.descriptor"] == {
        "mediaType": got.headers["Content-Type"],
        "digest": entry["containerimage.digest"],
        "size": len(got.content),
    }
    config_digest = got.json()["config"]["digest"]
    assert entry["containerimage.config.digest"] == config_digest
    config = httpx.get(
        f"{registry_server.url}/v2/{prefix}/e2e/base/blobs/{config_digest}", trust_env=False
    ).json()
    assert config["config"]["Labels"] == {
        "org.rocm.e2e.arch": "gfx1100",
        "org.rocm.e2e.run-id": "run-7",
        "org.rocm.e2e.max-jobs": "3",
    }

    [record] = history(docker_shim.env)
    assert record["ref"] == entry["buildx.build.ref"]
    assert record["name"] == name
    assert record["status"] == "Completed"
    assert record["completed_steps"] == record["total_steps"] > 0
    assert set(record) == {
        "ref", "name", "status", "created_at", "completed_at",
        "total_steps", "completed_steps", "cached_steps",
    }  # fmt: skip


@pytest.mark.real
def test_failing_build_writes_no_metadata_pushes_nothing_and_records_error(
    docker_shim: DockerShim, registry_server: RegistryServer, tmp_path: Path
) -> None:
    prefix = registry_server.new_repo("shim")
    metadata = tmp_path / "metadata.json"
    name = "rocm-pytorch-build/tool-wheel/noarch/run-8"
    failed = bake(
        docker_shim.env, metadata, "--progress=rawjson",
        "--set", f"tool-wheel.args.BUILDKIT_BUILD_NAME={name}", "--set", "tool-wheel.args.FAIL=1",
        "tool-wheel",
        PUBLISHED_INPUTS="1", RUN_ID="run-8", REGISTRY=f"{registry_server.host}/{prefix}",
    )  # fmt: skip
    assert failed.returncode == 1
    assert not metadata.exists()
    assert registry_digest(registry_server, f"{prefix}/e2e/tool-wheel", "1.0") is None
    *progress, last = failed.stderr.splitlines()
    assert last.startswith("ERROR: target tool-wheel: failed to solve")
    # rawjson: every progress line is a SolveStatus whose logs carry the engine's output.
    logs = b"".join(
        base64.b64decode(log["data"]) for line in progress for log in json.loads(line)["logs"]
    )
    assert b"tool.txt.missing" in logs
    [record] = history(docker_shim.env, "status=error")
    assert (record["name"], record["status"]) == (name, "Error")
    assert history(docker_shim.env, "status=completed") == []


# ##### REFUSALS


@pytest.mark.real
def test_unknown_builder_fails_like_buildx(docker_shim: DockerShim, tmp_path: Path) -> None:
    metadata = tmp_path / "metadata.json"
    refused = docker(
        docker_shim.env, "buildx", "bake", "-f", str(E2E_BAKE_FILE), "--builder", "nope",
        "--metadata-file", str(metadata), "base",
    )  # fmt: skip
    assert (refused.returncode, refused.stderr) == (1, 'ERROR: no builder "nope" found\n')
    assert not metadata.exists()


@pytest.mark.real
def test_target_context_is_refused_without_published_inputs(
    docker_shim: DockerShim, tmp_path: Path
) -> None:
    env = {k: v for k, v in docker_shim.env.items() if k != "PUBLISHED_INPUTS"}
    refused = bake(env, tmp_path / "metadata.json", "lib")
    assert refused.returncode == 1
    assert 'context "base-img" is "target:base"' in refused.stderr
    assert "PUBLISHED_INPUTS=1" in refused.stderr
    assert history(docker_shim.env) == []


@pytest.mark.real
def test_docker_image_context_is_refused_by_the_2010_client(
    docker_shim: DockerShim, tmp_path: Path
) -> None:
    # Debian's 20.10 client has no --build-context, so the shim cannot honour named contexts.
    real = docker_shim.env["ROCM_SHIM_REAL_DOCKER"]
    assert (
        "--build-context"
        not in subprocess.run(
            [real, "build", "--help"], capture_output=True, text=True, check=True
        ).stdout
    )
    metadata = tmp_path / "metadata.json"
    refused = bake(
        docker_shim.env, metadata, "--set", "app-wheel.contexts.lib-img=docker-image://r/lib:x",
        "app-wheel", PUBLISHED_INPUTS="1",
    )  # fmt: skip
    assert refused.returncode == 1
    assert 'named context "lib-img=docker-image://r/lib:x" needs' in refused.stderr
    assert "--build-context" in refused.stderr
    assert not metadata.exists()


# ##### RECORDING MODE (no engine)


def test_recording_mode_records_argv_and_env_literally(docker_shim_record: RecordingShim) -> None:
    metadata = docker_shim_record.state_dir.parent / "metadata.json"
    tricky = "rocm-pytorch-build/lib/gfx942/run 1;$(touch pwned)|&'\""
    argv = [
        "buildx", "bake", "-f", str(E2E_BAKE_FILE), "--builder", SHIM_BUILDER, "--push",
        "--metadata-file", str(metadata), "--progress=rawjson",
        "--set", f"lib.args.BUILDKIT_BUILD_NAME={tricky}", "--set", "lib.args.MAX_JOBS=12",
        "--", "lib",
    ]  # fmt: skip
    ran = docker(
        docker_shim_record.env, *argv,
        PUBLISHED_INPUTS="1", GPU_ARCH="gfx942", RUN_ID="abc-123", SCCACHE_LOG="debug",
        SDE_MIRROR="http://mirror a", UNRELATED="x", REGISTRY="127.0.0.1:5999",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert not (E2E_DIR / "pwned").exists()
    [record] = docker_shim_record.records()
    assert record["argv"] == argv
    assert record["env"] == {
        "PUBLISHED_INPUTS": "1", "GPU_ARCH": "gfx942", "RUN_ID": "abc-123",
        "SCCACHE_LOG": "debug", "SDE_MIRROR": "http://mirror a",
    }  # fmt: skip
    written = json.loads(metadata.read_text())
    assert written == record["metadata"]
    assert set(written) == {"lib"}
    assert REF.match(written["lib"]["buildx.build.ref"])
    assert written["lib"]["image.name"] == "127.0.0.1:5999/e2e/lib:gfx942"
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", written["lib"]["containerimage.digest"])
    [entry] = history(docker_shim_record.env)
    assert (entry["name"], entry["status"]) == (tricky, "Completed")


@pytest.mark.parametrize(
    ("mode", "returncode", "metadata_text", "status"),
    [
        ("fail", 1, None, "Error"),
        ("no-metadata", 0, None, "Completed"),
        ("bad-metadata", 0, "{not json", "Completed"),
    ],
)
def test_recording_mode_acts_out_failures(
    docker_shim_record: RecordingShim,
    mode: str,
    returncode: int,
    metadata_text: str | None,
    status: str,
) -> None:
    metadata = docker_shim_record.state_dir.parent / "metadata.json"
    ran = bake(
        docker_shim_record.env, metadata, "base", PUBLISHED_INPUTS="1", ROCM_SHIM_RECORD_MODE=mode
    )
    assert ran.returncode == returncode
    assert (metadata.read_text() if metadata.exists() else None) == metadata_text
    assert [r["status"] for r in history(docker_shim_record.env)] == [status]


def test_print_gives_bakes_json_with_set_overrides(docker_shim_record: RecordingShim) -> None:
    printed = docker(
        docker_shim_record.env, "buildx", "bake", "-f", str(E2E_BAKE_FILE), "--print",
        "--set", "app-wheel.args.MAX_JOBS=4", "--set", "app-wheel.tags=r/app:x", "app-wheel",
        PUBLISHED_INPUTS="1", GPU_ARCH="gfx1100", REGISTRY="reg:5000",
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == {
        "group": {"default": {"targets": ["app-wheel"]}},
        "target": {
            "app-wheel": {
                "context": ".",
                "dockerfile": "app.Dockerfile",
                "args": {"LIB_IMAGE": "reg:5000/e2e/lib:gfx1100", "RUN_ID": "dev", "MAX_JOBS": "4"},
                "tags": ["r/app:x"],
            }
        },
    }
    assert docker_shim_record.records() == []


# ##### SIGNALS (no engine)


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_double_dash_ends_the_options_as_in_buildx(docker_shim_record: RecordingShim) -> None:
    """After `--` every word is a target, so a name like `--print` cannot act as the flag."""
    printed = docker(
        docker_shim_record.env, "buildx", "bake", "-f", str(E2E_BAKE_FILE), "--print",
        "--", "app-wheel",
        PUBLISHED_INPUTS="1", GPU_ARCH="gfx1100", REGISTRY="reg:5000",
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    assert list(json.loads(printed.stdout)["target"]) == ["app-wheel"]
    as_target = docker(
        docker_shim_record.env, "buildx", "bake", "-f", str(E2E_BAKE_FILE),
        "--builder", SHIM_BUILDER, "--", "--print",
        PUBLISHED_INPUTS="1",
    )  # fmt: skip
    assert as_target.returncode == 1
    assert as_target.stderr.strip() == "ERROR: failed to find target --print"
    assert docker_shim_record.records() == []


def test_sigterm_ends_the_bake_and_kills_its_docker_build(
    docker_shim_record: RecordingShim, tmp_path: Path
) -> None:
    # A docker client stand-in whose build never ends: it reports its pid and sleeps.
    pid_file = tmp_path / "build.pid"
    fake = tmp_path / "fake-docker"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        f"tmp = {str(pid_file)!r} + '.tmp'\n"
        "open(tmp, 'w').write(str(os.getpid()))\n"
        f"os.replace(tmp, {str(pid_file)!r})\n"
        "print('#1 [internal] load build definition', flush=True)\n"
        "time.sleep(600)\n"
    )
    fake.chmod(0o755)
    env = {k: v for k, v in docker_shim_record.env.items() if k != "ROCM_SHIM_RECORD"}
    env.update(ROCM_SHIM_REAL_DOCKER=str(fake), PUBLISHED_INPUTS="1")
    metadata = tmp_path / "metadata.json"
    proc = subprocess.Popen(
        ["docker", "buildx", "bake", "-f", str(E2E_BAKE_FILE), "--builder", SHIM_BUILDER,
         "--push", "--metadata-file", str(metadata), "base"],
        env=env, cwd=E2E_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    _wait_for(pid_file, proc)
    child = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 128 + signal.SIGTERM
    assert b"ERROR: bake cancelled by signal 15" in stderr
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    assert not metadata.exists()
    assert [r["status"] for r in history(env)] == ["Canceled"]


def test_recording_mode_hang_ends_on_sigint(docker_shim_record: RecordingShim) -> None:
    metadata = docker_shim_record.state_dir.parent / "metadata.json"
    proc = subprocess.Popen(
        ["docker", "buildx", "bake", "-f", str(E2E_BAKE_FILE), "--builder", SHIM_BUILDER,
         "--metadata-file", str(metadata), "base"],
        env={**docker_shim_record.env, "ROCM_SHIM_RECORD_MODE": "hang"},
        cwd=E2E_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    _wait_for(docker_shim_record.state_dir / "history.jsonl", proc)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 128 + signal.SIGINT
    assert not metadata.exists()
    assert [r["status"] for r in history(docker_shim_record.env)] == ["Canceled"]
