"""The registry as a Dagster resource: configuration only; the work is in rocm_assets.core.registry.client."""

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Self

import dagster as dg
from pydantic import Field

from rocm_assets.core.common.constants import (
    REGISTRY_CA_ENV,
    REGISTRY_PASSWORD_ENV,
    REGISTRY_URL_ENV,
    REGISTRY_USERNAME_ENV,
)
from rocm_assets.core.registry.errors import RegistryError

if TYPE_CHECKING:
    from rocm_assets.core.registry.client import RegistryClient


class RegistryResource(dg.ConfigurableResource):
    """The OCI registry (Zot) the farm publishes to. Bind secrets with dg.EnvVar, never literals."""

    # None when ROCM_REGISTRY_URL is unset: the code location still loads and every run says why
    # it cannot check the registry, instead of failing at launch on an unresolvable EnvVar.
    url: str | None = Field(
        default=None, description="Registry base URL, e.g. https://zot.example:5000."
    )
    username: str | None = Field(default=None, description="HTTP Basic / token-realm user.")
    # repr=False: the resolved password must not show in logs or reprs of the resource.
    password: str | None = Field(default=None, repr=False, description="Bind with dg.EnvVar.")
    verify_tls: bool = Field(default=True, description="Verify the server certificate.")
    ca_bundle: str | None = Field(default=None, description="PEM CA bundle for a private CA.")
    connect_timeout: float = Field(default=5.0, description="Seconds to connect.")
    read_timeout: float = Field(default=30.0, description="Seconds to wait for a reply.")
    deadline: float | None = Field(
        default=None,
        description="Seconds one registry operation may take in all, connect to last byte, "
        "retries and pages included (default: connect_timeout + read_timeout).",
    )
    retries: int = Field(default=2, description="Retries on connection errors, 429 and 5xx.")
    backoff: float = Field(default=0.5, description="First retry delay in seconds; doubles.")

    @classmethod
    def from_env(cls) -> Self:
        """Bind the registry URL, credential and CA variables that are set, as EnvVars.

        Only the variables' presence is read here, so an open registry needs no credential
        variables at all (an unset EnvVar would fail the run); their values resolve at run time.
        """
        optional = {
            "username": REGISTRY_USERNAME_ENV,
            "password": REGISTRY_PASSWORD_ENV,
            "ca_bundle": REGISTRY_CA_ENV,
        }
        optional["url"] = REGISTRY_URL_ENV
        bound = {field: dg.EnvVar(name) for field, name in optional.items() if os.environ.get(name)}
        return cls(**bound)

    def client(self, warn: Callable[[str], None] | None = None) -> "RegistryClient":
        """A new RegistryClient (use it as a context manager); `warn` gets non-fatal findings."""
        # httpx is imported when a registry is first asked, not when the code location loads.
        from rocm_assets.core.registry.client import RegistryClient

        if not self.url:
            raise RegistryError(
                f"{REGISTRY_URL_ENV} is not set: point it at the registry bake pushes to "
                "(the REGISTRY host), e.g. https://zot.example:5000"
            )
        return RegistryClient(
            self.url,
            username=self.username,
            password=self.password,
            verify_tls=self.verify_tls,
            ca_bundle=self.ca_bundle,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            deadline=self.deadline,
            retries=self.retries,
            backoff=self.backoff,
            warn=warn,
        )
