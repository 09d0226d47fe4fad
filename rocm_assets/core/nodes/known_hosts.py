"""known_hosts read as OpenSSH reads it, for the node probes and the commands run on nodes.

paramiko's loader takes `@revoked` for a host name and the host pattern for a key type, and gives
up on the whole file, so one marker line used to exclude every node. Here each file is read line
by line: host patterns (`*`, `?`, `!negation`, `[host]:port`), hashed names (`|1|salt|hash`),
`@revoked` and `@cert-authority`. A line that cannot be read is skipped with a note naming the file
and line, as OpenSSH skips it. `check_host_key` decides as OpenSSH does: a revoked key is refused
even when another line lists it, a listed key is accepted, and every refusal names the line that
decided. Host certificates are the one thing not followed: paramiko cannot verify them, so a host
that only a `@cert-authority` line vouches for is refused with that line in the reason.
"""

import base64
import binascii
import hashlib
import hmac
import logging
import re
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import paramiko
    from fabric import Connection

logger = logging.getLogger(__name__)

# Markers as OpenSSH spells them (sshd(8), SSH_KNOWN_HOSTS FILE FORMAT).
REVOKED = "@revoked"
CERT_AUTHORITY = "@cert-authority"
# Far past any real known_hosts (one line is ~100 bytes), so reading one is bounded work.
MAX_KNOWN_HOSTS_BYTES = 16 << 20
_SSH_PORT = 22
# RSA host keys are listed as ssh-rsa and negotiated as one of these signature algorithms.
_RSA_ALGORITHMS = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")


class HostKeyRejected(Exception):
    """A node's host key refused by known_hosts; the message is the one-line reason."""


@dataclass(frozen=True, slots=True)
class KnownHost:
    """One usable known_hosts line: its marker ("" for a plain key), host patterns and key."""

    path: Path
    line: int
    marker: str
    hosts: str
    key_type: str
    blob: bytes

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def matches(self, host: str) -> bool:
        """Whether the line names `host` (`name` or `[name]:port`, as ssh looks it up)."""
        return host_matches(host, self.hosts)


def parse_known_hosts(text: str, path: Path) -> tuple[list[KnownHost], list[str]]:
    """The usable lines of a known_hosts file, and a note (file:line: why) per skipped line."""
    entries: list[KnownHost] = []
    notes: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        marker = ""
        if fields[0].startswith("@"):
            if fields[0] not in (REVOKED, CERT_AUTHORITY):
                notes.append(f"{path}:{number}: unknown marker {fields[0][:40]!r}; line skipped")
                continue
            marker, fields = fields[0], fields[1:]
        if len(fields) < 3:
            notes.append(f"{path}:{number}: expected hosts, key type and key; line skipped")
            continue
        hosts, key_type, encoded = fields[:3]
        try:
            blob = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            notes.append(f"{path}:{number}: the key is not base64; line skipped")
            continue
        if _blob_type(blob) != key_type:
            notes.append(f"{path}:{number}: the key is not a {key_type[:40]!r} key; line skipped")
            continue
        entries.append(KnownHost(path, number, marker, hosts, key_type, blob))
    return entries, notes


def _blob_type(blob: bytes) -> str | None:
    # An SSH public key blob starts with its type as an SSH string (uint32 length, bytes).
    if len(blob) < 4:
        return None
    (length,) = struct.unpack(">I", blob[:4])
    if length > 64 or len(blob) < 4 + length:
        return None
    return blob[4 : 4 + length].decode("ascii", errors="replace")


def host_matches(host: str, hosts: str) -> bool:
    """OpenSSH's rule: a hashed name, or a pattern list where any `!pattern` match excludes."""
    host = host.lower()
    if hosts.startswith("|"):
        return _hashed_match(host, hosts)
    matched = False
    for pattern in hosts.split(","):
        negated = pattern.startswith("!")
        if _pattern(pattern[1:] if negated else pattern).fullmatch(host):
            if negated:
                return False
            matched = True
    return matched


def _hashed_match(host: str, hashed: str) -> bool:
    # |1|base64(salt)|base64(HMAC-SHA1(salt, host)), as `ssh-keygen -H` and HashKnownHosts write.
    parts = hashed.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt = base64.b64decode(parts[2], validate=True)
        digest = base64.b64decode(parts[3], validate=True)
    except (binascii.Error, ValueError):
        return False
    mine = hmac.new(salt, host.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(mine, digest)


@lru_cache(maxsize=1024)
def _pattern(pattern: str) -> re.Pattern[str]:
    # `*` and `?` are the only wildcards; a run of stars is one star (no backtracking blow-up).
    collapsed = re.sub(r"\*+", "*", pattern.lower())
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in collapsed)
    return re.compile("".join(parts), re.DOTALL)


def check_host_key(
    entries: Iterable[KnownHost], host: str, key_type: str, blob: bytes, *, node_ssh: str
) -> None:
    """Accept `host`'s key (type and wire blob) as OpenSSH would, or raise HostKeyRejected.

    `host` is what ssh looks up (`name`, or `[name]:port` off port 22); `node_ssh` is how the
    reason names the node.
    """
    matching = [e for e in entries if e.matches(host)]
    for entry in matching:
        if entry.marker == REVOKED and entry.blob == blob:
            raise HostKeyRejected(f"host key of {node_ssh} is revoked ({entry.where})")
    plain = [e for e in matching if not e.marker]
    if any(e.blob == blob for e in plain):
        return
    same_type = [e for e in plain if e.key_type == key_type]
    if same_type:
        raise HostKeyRejected(
            f"host key of {node_ssh} does not match known_hosts ({same_type[0].where})"
        )
    if plain:
        raise HostKeyRejected(
            f"host key of {node_ssh} ({key_type}) not in known_hosts, which lists only "
            f"a {plain[0].key_type} key for it ({plain[0].where})"
        )
    authorities = [e for e in matching if e.marker == CERT_AUTHORITY]
    if authorities:
        raise HostKeyRejected(
            f"host key of {node_ssh} is vouched for only by {CERT_AUTHORITY} "
            f"({authorities[0].where}), and host certificates are not checked here: "
            "add the host's own key to known_hosts"
        )
    raise HostKeyRejected(f"host key of {node_ssh} not in known_hosts")


def preferred_key_types(entries: Iterable[KnownHost], host: str) -> set[str]:
    """Host key algorithms that would verify against a plain line for `host` (to ask for first)."""
    types: set[str] = set()
    for entry in entries:
        if not entry.marker and entry.matches(host):
            types.update(_RSA_ALGORITHMS if entry.key_type == "ssh-rsa" else (entry.key_type,))
    return types


class KnownHostsFiles:
    """The known_hosts files a probe trusts, each parsed once per version (mtime and size).

    Probes run from several threads every few seconds; the notes about skipped lines are logged
    once per version of a file, not once per probe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parsed: dict[Path, tuple[tuple[int, int], list[KnownHost]]] = {}

    def trust(self, conn: "Connection", paths: Sequence[Path], node_ssh: str) -> None:
        """Make `conn` (and its gateway) accept only host keys these files vouch for."""
        from fabric import Connection

        entries = self.entries(paths)
        # No key is loaded into paramiko (its loader gives up at marker lines), so every host
        # key reaches the policy; fabric's default policy would add unknown hosts instead.
        conn.client.set_missing_host_key_policy(_KnownHostsPolicy(entries, node_ssh))
        host = conn.host if conn.port == _SSH_PORT else f"[{conn.host}]:{conn.port}"
        preferred = preferred_key_types(entries, host)
        if preferred:
            conn.connect_kwargs["transport_factory"] = _transport_preferring(preferred)
        if isinstance(conn.gateway, Connection):
            self.trust(conn.gateway, paths, node_ssh)

    def entries(self, paths: Sequence[Path]) -> list[KnownHost]:
        found: list[KnownHost] = []
        for path in paths:
            found.extend(self._entries(path))
        return found

    def _entries(self, path: Path) -> list[KnownHost]:
        try:
            stat = path.stat()
        except OSError:
            return []  # an absent file lists no host, as for ssh
        version = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            cached = self._parsed.get(path)
        if cached is not None and cached[0] == version:
            return cached[1]
        entries, notes = _read(path)
        for note in notes:
            logger.warning("known_hosts %s", note)
        with self._lock:
            self._parsed[path] = (version, entries)
        return entries


class _KnownHostsPolicy:
    """paramiko's missing-host-key hook, asked about every key since paramiko is given none.

    It decides with `check_host_key`; a refusal raises HostKeyRejected out of `connect`.
    """

    def __init__(self, entries: Sequence[KnownHost], node_ssh: str) -> None:
        self._entries = entries
        self._node_ssh = node_ssh

    def missing_host_key(self, client: object, hostname: str, key: "paramiko.PKey") -> None:
        check_host_key(
            self._entries, hostname, key.get_name(), key.asbytes(), node_ssh=self._node_ssh
        )


def _transport_preferring(key_types: set[str]) -> "Callable[..., paramiko.Transport]":
    """A paramiko Transport that asks first for the host key types known_hosts lists.

    As ssh does, and as paramiko does for keys loaded into it: otherwise a host listed only by
    its ECDSA key would offer its Ed25519 key first and be refused as unknown.
    """
    import paramiko

    def transport(sock: Any, disabled_algorithms: Any = None) -> paramiko.Transport:
        made = paramiko.Transport(sock, disabled_algorithms=disabled_algorithms)
        options = made.get_security_options()
        offered = list(options.key_types)
        first = [t for t in offered if t in key_types]
        options.key_types = [*first, *(t for t in offered if t not in key_types)]
        return made

    return transport


def _read(path: Path) -> tuple[list[KnownHost], list[str]]:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_KNOWN_HOSTS_BYTES + 1)
    except OSError as exc:
        return [], [f"{path}: cannot read: {exc.strerror or type(exc).__name__}; file skipped"]
    notes = []
    if len(data) > MAX_KNOWN_HOSTS_BYTES:
        data = data[:MAX_KNOWN_HOSTS_BYTES]
        notes.append(f"{path}: larger than {MAX_KNOWN_HOSTS_BYTES >> 20} MiB; the rest skipped")
    entries, skipped = parse_known_hosts(data.decode("utf-8", errors="replace"), path)
    return entries, notes + skipped
