"""What registry requests name: image references, parsed as docker does, and auth challenges.

Pure parsing of the bake file's image references and of servers' WWW-Authenticate headers; the
client (`rocm_assets.core.registry.client`) builds on them.
"""

import re
from dataclasses import dataclass

from rocm_assets.core.registry.http import RegistryError

_CHALLENGE_PARAM = re.compile(r'([A-Za-z_][\w-]*)\s*=\s*(?:"([^"]*)"|([^,\s]*))')
_REPO_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
# OCI's tag and digest grammars (distribution/reference), ASCII only.
TAG = re.compile(r"\w[\w.-]{0,127}", re.ASCII)
DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}")


class ImageRefError(RegistryError):
    """An image reference that cannot be parsed."""


class ForeignImageError(RegistryError):
    """An image reference that names another registry host than the client's."""


@dataclass(frozen=True)
class ImageRef:
    host: str
    repo: str
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str:
        """What a manifest request names: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        text = f"{self.host}/{self.repo}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_image_ref(ref: str) -> ImageRef:
    """Split `host[:port]/ns/repo[:tag][@digest]` (or a `docker-image://` context) like docker."""
    text = ref.strip().removeprefix("docker-image://")
    name, at, digest = text.partition("@")
    if at and not DIGEST.fullmatch(digest):
        raise ImageRefError(f"bad image reference {ref!r}: {digest!r} is not a digest")
    tag = None
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        name, tag = name[:colon], name[colon + 1 :]
        if not TAG.fullmatch(tag):
            raise ImageRefError(f"bad image reference {ref!r}: {tag!r} is not a valid tag")
    first, slash, rest = name.partition("/")
    # Docker's rule: the first component is a registry host only if it looks like one.
    if slash and ("." in first or ":" in first or first == "localhost"):
        host, repo = first, rest
    else:
        host, repo = "docker.io", name if slash else f"library/{name}"
    if not all(_REPO_COMPONENT.fullmatch(part) for part in repo.split("/")):
        raise ImageRefError(f"bad image reference {ref!r}: {repo!r} is not a valid repository")
    if tag is None and not digest:
        tag = "latest"
    return ImageRef(host=host, repo=repo, tag=tag, digest=digest or None)


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="r",service="s"` -> ("bearer", {...}); Zot's `basic realm=x` form too."""
    scheme, _, rest = header.strip().partition(" ")
    params = {}
    for match in _CHALLENGE_PARAM.finditer(rest):
        quoted, bare = match.group(2), match.group(3)
        # First wins: a second challenge joined into the same header must not override it.
        params.setdefault(match.group(1).lower(), quoted if quoted is not None else bare)
    return scheme.lower(), params
