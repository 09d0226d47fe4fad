"""known_hosts as OpenSSH reads it: patterns, hashed names, `@revoked` and `@cert-authority`.

Real parts: OpenSSH's own `ssh-keygen -F` is the oracle for which lines name a host (patterns,
negation, `[host]:port`, hashed lines written by `ssh-keygen -H`); the probes and commands run
against Debian's sshd (`sshd_server`, rocm_assets_tests/servers/sshd.py) with real key exchange,
so the key checked is the one the server presents (Ed25519, or ECDSA when only that is listed).
Nothing here is mocked.
"""

import base64
import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rocm_assets.core.common.constants import SSH_KNOWN_HOSTS_ENV
from rocm_assets.core.nodes.fleet import Node
from rocm_assets.core.nodes.known_hosts import (
    HostKeyRejected,
    KnownHost,
    check_host_key,
    parse_known_hosts,
)
from rocm_assets.core.nodes.probes import NodeCommandError, probe_node, run_on_node
from rocm_assets_tests.servers.sshd import SshdServer

# Generous per-phase bound: on a loaded 2-core CI box sshd can take over 2 s to send its
# banner. It costs time only when a probe fails, and failures here are not timeouts.
FAST = {"timeout_s": 15.0, "sample_s": 0.1}


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The user's ~/.ssh (known_hosts, config) must not decide what these tests see.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(SSH_KNOWN_HOSTS_ENV, raising=False)


@pytest.fixture(scope="module")
def other_key(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`type base64` of a key no server here holds: a CA key, or someone else's host key."""
    key = tmp_path_factory.mktemp("other") / "key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
        check=True,
        capture_output=True,
    )
    return " ".join(key.with_suffix(".pub").read_text().split()[:2])


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def _blob(public_key: str) -> tuple[str, bytes]:
    key_type, encoded = public_key.split()
    return key_type, base64.b64decode(encoded)


# --- which lines name a host: ssh-keygen -F is the oracle -------------------------------------

HOSTS = [
    "a.example",
    "bad.example",
    "node1",
    "node12",
    "[127.0.0.1]:2222",
    "[127.0.0.1]:22",
    "[x]:2233",
    "host",
    "HOST",
    "10.0.0.7",
]


def _pattern_lines(key: str) -> list[str]:
    return [
        "# comment, then a blank line",
        "",
        f"*.example,!bad.example {key}",
        f"[127.0.0.1]:2222 {key}",
        f"@revoked node? {key}",
        f"@cert-authority [*]:22?? {key}",
        f"h?st,10.0.0.* {key}",
        f"@cert-authority *.example {key}",
    ]


def _ssh_keygen_lines(host: str, path: Path) -> set[int]:
    done = subprocess.run(
        ["ssh-keygen", "-F", host, "-f", str(path)], capture_output=True, text=True, check=False
    )
    return {int(n) for n in re.findall(r"^# Host .* found: line (\d+)", done.stdout, re.M)}


@pytest.mark.real
@pytest.mark.parametrize("hashed", [False, True], ids=["plain", "hashed"])
def test_lines_naming_a_host_are_the_ones_openssh_finds(
    tmp_path: Path, other_key: str, hashed: bool
) -> None:
    path = _write(tmp_path / "known_hosts", _pattern_lines(other_key))
    if hashed:
        # ssh-keygen -H hashes each plain name (patterns stay as they are), as HashKnownHosts.
        subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(path)], check=True, capture_output=True)
        assert "|1|" in path.read_text()
    entries, notes = parse_known_hosts(path.read_text(), path)
    assert notes == []
    for host in HOSTS:
        ours = {e.line for e in entries if e.matches(host)}
        assert ours == _ssh_keygen_lines(host, path), host


def test_parse_skips_what_it_cannot_read_and_says_where(tmp_path: Path, other_key: str) -> None:
    key_type, encoded = other_key.split()
    path = tmp_path / "known_hosts"
    lines = [
        f"@unknown-marker host {other_key}",
        "host-without-key",
        f"host {key_type} not*base64",
        f"host ssh-rsa {encoded}",  # an Ed25519 key filed under another type
        f"@revoked * {other_key}",
        f"good {other_key} a comment",
    ]
    entries, notes = parse_known_hosts("\n".join(lines), path)
    assert [(e.line, e.marker, e.hosts) for e in entries] == [(5, "@revoked", "*"), (6, "", "good")]
    assert notes == [
        f"{path}:1: unknown marker '@unknown-marker'; line skipped",
        f"{path}:2: expected hosts, key type and key; line skipped",
        f"{path}:3: the key is not base64; line skipped",
        f"{path}:4: the key is not a 'ssh-rsa' key; line skipped",
    ]


# --- deciding: OpenSSH's order (revoked, listed, changed, CA-only, unknown) --------------------


def _entries(tmp_path: Path, lines: list[str]) -> list[KnownHost]:
    path = tmp_path / "known_hosts"
    entries, notes = parse_known_hosts("\n".join(lines), path)
    assert notes == []
    return entries


def test_a_revoked_key_is_refused_even_when_listed(tmp_path: Path, other_key: str) -> None:
    key_type, blob = _blob(other_key)
    entries = _entries(tmp_path, [f"host {other_key}", f"@revoked * {other_key}"])
    with pytest.raises(HostKeyRejected) as caught:
        check_host_key(entries, "host", key_type, blob, node_ssh="root@host")
    assert str(caught.value) == f"host key of root@host is revoked ({tmp_path / 'known_hosts'}:2)"
    # A revoked line names hosts too: for another host it does not apply.
    revoked_elsewhere = _entries(tmp_path, [f"host {other_key}", f"@revoked other {other_key}"])
    check_host_key(revoked_elsewhere, "host", key_type, blob, node_ssh="root@host")


def test_a_cert_authority_alone_is_named_as_the_reason(tmp_path: Path, other_key: str) -> None:
    key_type, blob = _blob(other_key)
    entries = _entries(tmp_path, [f"@cert-authority *.lan {other_key}"])
    with pytest.raises(HostKeyRejected) as caught:
        check_host_key(entries, "n1.lan", key_type, blob, node_ssh="root@n1.lan")
    assert str(caught.value) == (
        f"host key of root@n1.lan is vouched for only by @cert-authority "
        f"({tmp_path / 'known_hosts'}:1), and host certificates are not checked here: "
        "add the host's own key to known_hosts"
    )


# --- against the real sshd ---------------------------------------------------------------------


def _node(sshd: SshdServer, canned: str = "big") -> Node:
    return Node(
        name=canned,
        builder=f"{canned}-builder",
        ssh=sshd.ssh_address(canned),
        cores=1,
        mem_gb=1,
        link_mbps=100,
    )


def _fixture_lines(sshd: SshdServer) -> list[str]:
    return sshd.known_hosts.read_text().splitlines()


@pytest.mark.real
def test_a_cert_authority_line_does_not_break_the_other_entries(
    sshd_server: SshdServer, tmp_path: Path, other_key: str
) -> None:
    lines = [f"@cert-authority *.example {other_key}", *_fixture_lines(sshd_server)]
    known = _write(tmp_path / "known_hosts", lines)
    probe = probe_node(
        _node(sshd_server), **FAST, connect_kwargs=sshd_server.connect_kwargs(), known_hosts=known
    )
    assert (probe.ok, probe.reason, probe.cores) == (True, None, 32)


@pytest.mark.real
def test_a_revoked_host_key_is_refused_naming_the_line(
    sshd_server: SshdServer, tmp_path: Path
) -> None:
    # Listed for its port and revoked for every host: OpenSSH refuses it, so do we.
    lines = [*_fixture_lines(sshd_server), f"@revoked * {sshd_server.host_public_key}"]
    known = _write(tmp_path / "known_hosts", lines)
    node = _node(sshd_server)
    expected = f"host key of {node.ssh} is revoked ({known}:{len(lines)})"
    probe = probe_node(node, **FAST, connect_kwargs=sshd_server.connect_kwargs(), known_hosts=known)
    assert (probe.ok, probe.reason) == (False, expected)
    with pytest.raises(NodeCommandError) as caught:
        run_on_node(
            node,
            ["true"],
            timeout_s=5,
            connect_timeout_s=15,
            connect_kwargs=sshd_server.connect_kwargs(),
            known_hosts=known,
        )
    assert str(caught.value) == f"big: {expected}"
    # Revocation is by key, not by line: every port of this sshd presents it, so every node.
    assert not probe_node(
        _node(sshd_server, "small"),
        **FAST,
        connect_kwargs=sshd_server.connect_kwargs(),
        known_hosts=known,
    ).ok


@pytest.mark.real
def test_a_host_only_a_cert_authority_vouches_for_is_excluded_with_the_line(
    sshd_server: SshdServer, tmp_path: Path, other_key: str
) -> None:
    known = _write(tmp_path / "known_hosts", [f"@cert-authority [127.0.0.1]:* {other_key}"])
    node = _node(sshd_server)
    probe = probe_node(node, **FAST, connect_kwargs=sshd_server.connect_kwargs(), known_hosts=known)
    assert not probe.ok
    assert probe.reason == (
        f"host key of {node.ssh} is vouched for only by @cert-authority ({known}:1), and host "
        "certificates are not checked here: add the host's own key to known_hosts"
    )


@pytest.mark.real
def test_unreadable_lines_are_skipped_with_a_note_naming_them(
    sshd_server: SshdServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = ["@bogus-marker x ssh-ed25519 AAAA", "garbage", *_fixture_lines(sshd_server)]
    known = _write(tmp_path / "known_hosts", lines)
    with caplog.at_level(logging.WARNING, logger="rocm_assets.core.nodes.known_hosts"):
        for _ in range(2):
            probe = probe_node(
                _node(sshd_server),
                **FAST,
                connect_kwargs=sshd_server.connect_kwargs(),
                known_hosts=known,
            )
            assert probe.ok, probe.reason
    # Once per version of the file, not once per probe.
    assert [r.getMessage() for r in caplog.records] == [
        f"known_hosts {known}:1: unknown marker '@bogus-marker'; line skipped",
        f"known_hosts {known}:2: expected hosts, key type and key; line skipped",
    ]


@pytest.mark.real
def test_hashed_and_wildcard_entries_are_honoured(sshd_server: SshdServer, tmp_path: Path) -> None:
    hashed = _write(tmp_path / "hashed", _fixture_lines(sshd_server))
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(hashed)], check=True, capture_output=True)
    wildcard = _write(tmp_path / "wildcard", [f"[127.0.0.1]:* {sshd_server.host_public_key}"])
    port = sshd_server.ports["big"]
    negated = _write(
        tmp_path / "negated",
        [f"[127.0.0.1]:*,![127.0.0.1]:{port} {sshd_server.host_public_key}"],
    )
    node = _node(sshd_server)
    for known, ok in ((hashed, True), (wildcard, True), (negated, False)):
        probe = probe_node(
            node, **FAST, connect_kwargs=sshd_server.connect_kwargs(), known_hosts=known
        )
        assert probe.ok is ok, (known.name, probe.reason)
    assert probe.reason == f"host key of {node.ssh} not in known_hosts"


@pytest.mark.real
def test_the_listed_key_type_is_asked_for_first(sshd_server: SshdServer, tmp_path: Path) -> None:
    # sshd offers Ed25519 (paramiko's first choice) and ECDSA; known_hosts lists only ECDSA.
    port = sshd_server.ports["small"]
    known = _write(
        tmp_path / "known_hosts", [f"[127.0.0.1]:{port} {sshd_server.host_public_key_ecdsa}"]
    )
    probe = probe_node(
        _node(sshd_server, "small"),
        **FAST,
        connect_kwargs=sshd_server.connect_kwargs(),
        known_hosts=known,
    )
    assert (probe.ok, probe.reason) == (True, None)


@pytest.mark.real
def test_an_unreadable_known_hosts_file_is_skipped(sshd_server: SshdServer, tmp_path: Path) -> None:
    # A directory where a file should be: OpenSSH skips it; the extra file still counts.
    (tmp_path / ".ssh" / "known_hosts").mkdir(parents=True)
    extra = shutil.copy(sshd_server.known_hosts, tmp_path / "extra")
    probe = probe_node(
        _node(sshd_server),
        **FAST,
        connect_kwargs=sshd_server.connect_kwargs(),
        known_hosts=extra,
    )
    assert (probe.ok, probe.reason) == (True, None)


def test_no_raw_exception_escapes_run_on_node() -> None:
    node = Node(
        name="x", builder="b", ssh="root@127.0.0.1:notaport", cores=1, mem_gb=1, link_mbps=1
    )
    with pytest.raises(NodeCommandError) as caught:
        run_on_node(node, ["true"], timeout_s=1, connect_timeout_s=1)
    assert str(caught.value) == (
        "x: ssh to root@127.0.0.1:notaport failed: ValueError: invalid literal for int() with "
        "base 10: 'notaport'"
    )
    assert probe_node(node, timeout_s=1).reason == str(caught.value).removeprefix("x: ")
