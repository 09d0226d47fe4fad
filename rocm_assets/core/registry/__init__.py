"""The registry: image references, the HTTP client and its deadline transport, and preflight."""
