"""Builds: the bake invocation and its guard, build selections, Dockerfiles and their checks
against the bake file, and code versions. Kept empty: the guard starts with `python -m` and
must not pay for the rest."""
