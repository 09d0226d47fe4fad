"""The fleet: its manifest, live SSH probes of each node, and the known_hosts they are checked
against."""
