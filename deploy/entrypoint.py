# A script copied into the image, not a module of a package.
# ruff: noqa: INP001
"""Entrypoint of the rocm-assets image: secrets from files, registry auth, then exec the command.

- `NAME_FILE` (a docker secret's path) fills NAME when NAME is unset or empty, for the registry
  credentials and the PostgreSQL password.
- With ROCM_REGISTRY_USERNAME and ROCM_REGISTRY_PASSWORD set, the registry's auth goes into
  $DOCKER_CONFIG/config.json (mode 0600), for the registry host in REGISTRY (bake's) and the one in
  ROCM_REGISTRY_URL. `docker buildx bake --push` sends credentials from there to the BuildKit node;
  `docker login` would need a local Docker engine, which a run worker does not have.
- Then it becomes the command. A problem is one line on stderr and exit 2; no value is printed.
"""

import base64
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

FILE_VARS = ("ROCM_REGISTRY_USERNAME", "ROCM_REGISTRY_PASSWORD", "DAGSTER_POSTGRES_PASSWORD")


class EntrypointError(Exception):
    """A setting the container cannot start with; the message names it."""


def secrets_from_files(env: dict[str, str]) -> None:
    for name in FILE_VARS:
        path = env.get(f"{name}_FILE")
        if path and not env.get(name):
            try:
                env[name] = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
            except OSError as exc:
                raise EntrypointError(
                    f"{name}_FILE={path}: cannot read it: {exc.strerror or exc}"
                ) from None


def registry_hosts(env: dict[str, str]) -> list[str]:
    """host[:port] of bake's REGISTRY and of ROCM_REGISTRY_URL, without duplicates."""
    hosts: list[str] = []
    bake_registry = env.get("REGISTRY", "").split("/", 1)[0]
    url = env.get("ROCM_REGISTRY_URL", "")
    url_host = urlsplit(url if "://" in url else f"https://{url}").netloc if url else ""
    for host in (bake_registry, url_host):
        if host and host not in hosts:
            hosts.append(host)
    return hosts


def write_registry_auth(env: dict[str, str]) -> None:
    username, password = env.get("ROCM_REGISTRY_USERNAME"), env.get("ROCM_REGISTRY_PASSWORD")
    if not username or not password:
        return
    hosts = registry_hosts(env)
    if not hosts:
        raise EntrypointError(
            "ROCM_REGISTRY_USERNAME/PASSWORD are set but neither REGISTRY nor ROCM_REGISTRY_URL "
            "names the registry they are for"
        )
    config_dir = Path(env.get("DOCKER_CONFIG") or Path.home() / ".docker")
    config_file = config_dir / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        config = {}
    except (OSError, ValueError) as exc:
        raise EntrypointError(f"{config_file}: cannot read it as JSON: {exc}") from None
    token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
    auths = config.setdefault("auths", {})
    for host in hosts:
        auths[host] = {"auth": token}
    try:
        config_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        staged = config_file.with_name(f".config.json.{os.getpid()}")
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(config, out, indent=2)
        staged.replace(config_file)
    except OSError as exc:
        raise EntrypointError(
            f"{config_file}: cannot write the registry auth: {exc.strerror or exc}"
        ) from None


def main(argv: list[str]) -> None:
    if not argv:
        raise EntrypointError("no command to run")
    env = dict(os.environ)
    secrets_from_files(env)
    write_registry_auth(env)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        raise EntrypointError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except EntrypointError as exc:
        sys.stderr.write(f"rocm-assets entrypoint: {exc}\n")
        sys.exit(2)
