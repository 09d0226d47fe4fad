"""`features`: the oldest buildx a bake file needs, read from the file alone.

Pure tests: python-hcl2 parses for real. Which bake refuses what is checked against real bake in
test_bake_regressions (a variable's description, a newer stdlib function) and, over generated
files, in test_bake_differential.
"""

from pathlib import Path

import pytest

from rocm_assets.core.bake import BakeError, load_bake, resolve
from rocm_assets.core.bake.features import Requirement, minimum, requirements
from rocm_assets_tests.helpers import PROJECT_ROOT

FILE = """variable "V" {
  type        = string
  default     = "x"
  description = "d"
  validation {
    condition     = V != ""
    error_message = "empty"
  }
}
function "basename" {
  params = [s]
  result = s
}
target "t" {
  description = "t"
  network     = "host"
  extra-hosts = { db = "10.0.0.1" }
  cache-from  = [{ type = "registry", ref = "r/c" }]
  args = {
    A = sanitize(V)
    B = indexof(["x"], V)
    C = basename("a/b")
  }
}
"""


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "bake.hcl"
    path.write_text(text)
    return load_bake(path)


def test_each_construct_is_listed_with_its_release_and_line(tmp_path: Path) -> None:
    found = {(r.construct, r.version_text, r.line) for r in requirements(load(tmp_path, FILE))}
    assert found == {
        ("variable 'V': type", "0.24.0", 2),
        ("variable 'V': description", "0.16.0", 4),
        ("variable 'V': validation", "0.19.0", 5),
        ("target 't': description", "0.16.0", 15),
        ("target 't': network", "0.17.0", 16),
        ("target 't': extra-hosts", "0.25.0", 17),
        ("target 't': cache-from entry as an object", "0.19.0", 18),
        ("function sanitize()", "0.17.0", 20),
        ("function indexof()", "0.14.0", 21),
        # basename is the file's own function here: 0.13.1 reads it (newer bakes take theirs).
    }


def test_minimum_is_the_newest_requirement(tmp_path: Path) -> None:
    needs = minimum(load(tmp_path, FILE))
    assert needs == Requirement((0, 25, 0), "target 't': extra-hosts", 17)
    assert str(needs) == "target 't': extra-hosts (line 17) needs buildx >= 0.25.0"
    assert minimum(load(tmp_path, 'target "t" {\n  tags = ["a:1"]\n}\n')) is None


@pytest.mark.parametrize(
    "path", [PROJECT_ROOT / "rocm-bake.hcl", PROJECT_ROOT / "examples" / "farm" / "bake.hcl"]
)
def test_shipped_files_read_on_every_buildx(path: Path) -> None:
    assert minimum(load_bake(path)) is None


def test_resolve_for_an_older_bake_fails_as_that_bake_would(tmp_path: Path) -> None:
    bake = load(tmp_path, 'variable "V" {\n  default = "x"\n  description = "d"\n}\n')
    resolve(bake, {}, version=(0, 16, 0))
    with pytest.raises(BakeError, match=r"bake\.hcl:3: variable 'V': description \(line 3\) "):
        resolve(bake, {}, version=(0, 13, 1))
