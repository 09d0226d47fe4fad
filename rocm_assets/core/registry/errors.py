"""What the registry client's callers name without talking to a registry: its error and its
answer for a tag. No httpx here, so the code location loads without importing it (0.27 s)."""

from dataclasses import dataclass

from rocm_assets.core.common.text import bounded

# A registry error is one line; this bounds it whatever it quotes.
_MAX_MESSAGE = 1000


class RegistryError(Exception):
    """A registry request failed: never means "absent". The message is one line, secret-free.

    `transient`: the registry could not be reached, or answered 5xx or 429, after the client's
    own retries: the same request may succeed once the registry is back.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        status: int | None = None,
        transient: bool = False,
    ) -> None:
        super().__init__(bounded(message, _MAX_MESSAGE))
        self.url = url
        self.status = status
        self.transient = transient


@dataclass(frozen=True)
class ImageInfo:
    tag: str
    digest: str
    # Zot's PushTimestamp (epoch seconds); None when the server does not say.
    pushed_at: float | None = None
