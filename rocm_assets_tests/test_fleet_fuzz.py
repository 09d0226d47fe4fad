"""Property-based tests of the fleet loader: any input ends as a Fleet or one FleetError line.

Real: the shipped fleet.yaml is the seed of the mutations, and `parse_fleet` runs whole (PyYAML,
the loader's limits, pydantic). Inputs come from Hypothesis: YAML-ish token soup, random edits of
fleet.yaml (anchors, aliases, `.inf`, odd keys, tags, brackets spliced in anywhere) and
well-formed documents whose fields hold wrong values next to a credential under a key the schema
does not know. The per-example deadline is a hang guard: the alias bomb took minutes and memory.
"""

import math
from datetime import timedelta
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, settings, strategies as st

from rocm_assets.core.nodes.fleet import Fleet, FleetError, parse_fleet
from rocm_assets_tests.helpers import SHIPPED_FLEET

SOURCE = "fleet.yaml"
SHIPPED = SHIPPED_FLEET.read_text()
SECRET = "s3cr3t-Zq8w1Lk0"
# Generous: a hang guard on a loaded shared machine, not a speed figure.
FUZZ = settings(
    max_examples=300,
    deadline=timedelta(seconds=5),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Pieces of YAML and of this schema that reach the loader's odd corners.
TOKENS = [
    "nodes:",
    "target_costs:",
    "reference:",
    "- ",
    "  ",
    "\n",
    "\t",
    ": ",
    ",",
    "[",
    "]",
    "{",
    "}",
    "&a ",
    "*a",
    "&b [*a, *a, *a]",
    "<<: *a",
    "? ",
    "!!python/object:os.system ",
    "!!binary ",
    "!!set ",
    "!!omap ",
    "!local ",
    "'",
    '"',
    "|",
    ">",
    "#",
    "---",
    "...",
    "%YAML 1.1",
    ".inf",
    "-.inf",
    ".nan",
    "1e999",
    "1e3",
    "0x1F",
    "0o17",
    "1_000",
    "10:20",
    "null",
    "~",
    "on",
    "yes",
    "2001-02-30",
    "2024-01-01T00:00:00Z",
    "9" * 5000,
    "name: a",
    "builder: b",
    "cores: 8",
    "mem_gb: 32",
    "link_mbps: 100",
    "gpus: [gfx942]",
    "seconds: 60",
    "size_gb: 1",
    "ssh: root@h",
    "1: x",
    "null: x",
    "[a]: b",
    "\\u0000",
    "\x00",
    "\ufeff",
    "\u202e",
    "é",
]


def _check(text: str) -> None:
    try:
        fleet = parse_fleet(text, SOURCE)
    except FleetError as error:
        message = str(error)
        assert message.startswith(SOURCE), message
        assert "\n" not in message
        # The source, a line and column, a field path and a short quote: never the input's size.
        assert len(message) < 600, len(message)
        assert SECRET not in message
        # The boundary's catch-all is for what nobody foresaw: no input here should need it.
        assert "cannot read the fleet:" not in message, message
        event(_kind(message))
    else:
        event("a fleet")
        assert isinstance(fleet, Fleet)
        figures = [n.mem_gb for n in fleet.nodes] + [c.seconds for c in fleet.costs.values()]
        assert all(math.isfinite(f) for f in figures)


def _kind(message: str) -> str:
    """What kind of refusal a message is, for `--hypothesis-show-statistics`."""
    if "invalid YAML: " in message:
        return "YAML: " + " ".join(message.split("invalid YAML: ")[1].split()[:3])
    return "schema: " + " ".join(message.rsplit(": ", 1)[-1].split()[:3])


# Printable text between the tokens; control characters come from TOKENS.
TEXT = st.text(st.characters(exclude_categories=("Cc", "Cs")), max_size=8)


@FUZZ
@given(st.lists(st.sampled_from(TOKENS) | TEXT, max_size=60).map("".join))
def test_token_soup_ends_in_a_fleet_or_one_line(text: str) -> None:
    _check(text)


def _edits() -> st.SearchStrategy[str]:
    """The shipped file with one to six random splices, deletions or line duplications."""

    @st.composite
    def edited(draw: st.DrawFn) -> str:
        text = SHIPPED
        for _ in range(draw(st.integers(1, 6))):
            at = draw(st.integers(0, len(text)))
            kind = draw(st.sampled_from(["insert", "delete", "duplicate"]))
            if kind == "insert":
                text = text[:at] + draw(st.sampled_from(TOKENS)) + text[at:]
            elif kind == "delete":
                text = text[:at] + text[at + draw(st.integers(1, 40)) :]
            else:
                lines = text.splitlines(keepends=True)
                index = draw(st.integers(0, len(lines) - 1))
                text = "".join([*lines[: index + 1], *lines[index:]])
        return text

    return edited()


@FUZZ
@given(_edits())
def test_edits_of_the_shipped_fleet_end_in_a_fleet_or_one_line(text: str) -> None:
    _check(text)


# Well-formed YAML, wrong values: every field may hold anything, and a credential sits under a
# key the schema does not have, at any level. The error names the field; it never shows that.
ODD = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=80)
    | st.lists(st.text(max_size=5), max_size=3)
    | st.dictionaries(st.text(max_size=5), st.integers(), max_size=2)
)
GOOD_NODE: dict[str, Any] = {"name": "n", "builder": "b", "cores": 8, "mem_gb": 32, "link_mbps": 10}


@st.composite
def _documents(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(0, 4))
    nodes = []
    for index in range(count):
        node = {**GOOD_NODE, "name": f"n{index}", "builder": f"b{draw(st.integers(0, 3))}"}
        for key in draw(st.lists(st.sampled_from([*GOOD_NODE, "ssh", "gpus"]), max_size=2)):
            node[key] = draw(ODD)
        nodes.append(node)
    costs: dict[str, Any] = {
        "reference": {"cores": 32, "mem_gb": draw(st.sampled_from([122, 0, -1, math.inf]))},
        "pytorch": {"seconds": draw(ODD), "size_gb": 1.0},
    }
    doc: dict[str, Any] = {"nodes": nodes, "target_costs": costs}
    # The credential: under an unknown key at the top, in a node, a cost entry or the reference.
    holders = [doc, *nodes, costs["pytorch"], costs["reference"]]
    draw(st.sampled_from(holders))[draw(st.sampled_from(["password", "token", "x"]))] = SECRET
    return doc


@FUZZ
@given(_documents())
def test_wrong_values_are_named_and_no_secret_is_shown(doc: dict[str, Any]) -> None:
    _check(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
