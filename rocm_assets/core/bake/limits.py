"""The bounds on the work one bake file may cause, and the budget that enforces them.

Every process that loads the bake file (the daemon, the webserver, run workers, the CLI) runs this
evaluator, so a file must not be able to hang it, exhaust its memory or overflow Python's stack.
Each limit is far above what a real bake file needs: the shipped rocm-bake.hcl, loaded as a
whole graph (11 evaluations), uses under 2% of the step budget, 5 of the 80 nesting levels and
18 of the 120 parse levels (`rocm_assets_tests/test_bake_bad_input.py` measures it).
"""

from typing import Any

# Bytes of bake file read; python-hcl2 parses about 1 MB in a few seconds.
MAX_FILE_BYTES = 1 << 20
# Depth of python-hcl2's parse tree (about two levels per bracket or call). python-hcl2 turns
# that tree into rules recursively, so deeper input would overflow Python's stack there.
MAX_PARSE_DEPTH = 120
# Nested evaluation: expressions within expressions, variable and target references, user
# function calls. Each level costs at most a few Python frames, so the evaluator stays well
# below Python's recursion limit even when called from deep in Dagster's stack.
MAX_DEPTH = 80
# Nesting of the values an expression builds (lists of lists of objects ...).
MAX_VALUE_DEPTH = 64
# Elements of one list or object, including range() and a matrix's combinations.
MAX_COLLECTION = 100_000
# Characters of one string.
MAX_STRING = 1 << 20
# Work per graph load (every evaluation of the file together): one step per expression
# evaluated, per element built, and per 64 characters of string built. About a microsecond
# each, so a load ends within about a second, with at most 64 MB of strings built.
MAX_STEPS = 1_000_000
CHARS_PER_STEP = 64
# Arches in GPU_ARCHES: each is a partition and an evaluation of the whole file.
MAX_ARCHES = 64


class LimitError(ValueError):
    """A bound above was reached; the message names the limit."""


def quote(value: Any, limit: int = 60) -> str:
    """A short rendering of a value for an error message: never the whole of a large value."""
    if isinstance(value, str):
        text = repr(value[: limit + 1])
        return text if len(value) <= limit else f"{text[:-1]}...{text[-1]}"
    if isinstance(value, list):
        return f"a tuple of {len(value)} elements"
    if isinstance(value, dict):
        return f"an object of {len(value)} attributes"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_length(size: int, what: str, limit: int, unit: str) -> None:
    """Refuse, before building it, a result of `size` units when the limit is `limit`."""
    if size > limit:
        raise LimitError(f"{what} would make {size} {unit}, over the limit of {limit}")


def expanded_size(value: Any, cap: int, what: str) -> int:
    """Elements and characters of `value` counted as if shared parts were copied, up to `cap`.

    Walking, comparing or printing a value costs its expanded size, which sharing can make
    exponential in what the file wrote (`A2 = [A1, A1]`); this refuses such a value cheaply.
    """
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            total += 1 + len(item)
            stack.extend(item)
        elif isinstance(item, dict):
            total += 1 + len(item)
            stack.extend(item.values())
        elif isinstance(item, str):
            total += 1 + len(item) // CHARS_PER_STEP
        else:
            total += 1
        if total > cap:
            raise LimitError(f"{what}: the value is over {cap} elements when expanded")
    return total


class Budget:
    """Steps left for one graph load, and the depth and size checks of the values it builds."""

    def __init__(self, steps: int = MAX_STEPS):
        self.limit = steps
        self.left = steps
        self.deepest = 0  # the deepest nesting reached, for measuring headroom
        # id -> (value, depth) of every collection checked: keeps them alive so an id is never
        # reused, and makes checking a value that shares parts cost only its new parts.
        self._depths: dict[int, tuple[Any, int]] = {}

    @property
    def used(self) -> int:
        return self.limit - self.left

    def spend(self, steps: int = 1) -> None:
        self.left -= steps
        if self.left < 0:
            raise LimitError(f"evaluation took over {self.limit} steps, the limit")

    def built(self, value: Any) -> Any:
        """Charge for a value an expression or function made, and check its size and depth."""
        if isinstance(value, str):
            check_length(len(value), "this string", MAX_STRING, "characters")
            self.spend(1 + len(value) // CHARS_PER_STEP)
        elif isinstance(value, list | dict):
            check_length(len(value), "this collection", MAX_COLLECTION, "elements")
            self.spend(1 + len(value))
            if self._depth(value) > MAX_VALUE_DEPTH:
                raise LimitError(f"values nest over {MAX_VALUE_DEPTH} deep, the limit")
        return value

    def _depth(self, value: Any) -> int:
        # Iterative post-order walk over the parts not seen before.
        pending: list[tuple[Any, bool]] = [(value, False)]
        while pending:
            item, ready = pending.pop()
            key = id(item)
            if key in self._depths:
                continue
            children = [
                c
                for c in (item if isinstance(item, list) else item.values())
                if isinstance(c, list | dict)
            ]
            if ready:
                depth = 1 + max((self._depths[id(c)][1] for c in children), default=0)
                self._depths[key] = (item, depth)
                if depth > MAX_VALUE_DEPTH:
                    return depth
                continue
            pending.append((item, True))
            pending.extend((c, False) for c in children if id(c) not in self._depths)
        return self._depths[id(value)][1]
