"""The bounds on what one bake file may make every process that loads it do: bake evaluates the
file, but python-hcl2 still parses it (for lines and names), and the graph still walks it."""

# Bytes of bake file read; python-hcl2 parses about 1 MB in a few seconds.
MAX_FILE_BYTES = 1 << 20
# Depth of python-hcl2's parse tree (about two levels per bracket or call). python-hcl2 turns
# that tree into rules recursively, so deeper input would overflow Python's stack there.
MAX_PARSE_DEPTH = 120
# Groups within groups.
MAX_DEPTH = 80
# Arches in GPU_ARCHES: each is a partition and a `bake --print` per input mode.
MAX_ARCHES = 64
