"""A clone of the repository is all a user has: nothing in the product or its tests may read a
file from outside it (a folder beside the checkout, a developer's home)."""

import re
import subprocess
from pathlib import Path

from tests.reference import REFERENCE_DIR

REPO = Path(__file__).resolve().parents[2]

# The folder of reading material that sits beside a developer's checkout, named as a path: a
# user's clone has nothing beside it.
OUTSIDE_PATH = re.compile("\\.\\./" + "shared|/ [\"']" + "shared[\"']|[\"']" + "shared[\"'] /")


def _tracked_files(*patterns: str) -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--", *patterns], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO / name for name in listed if (REPO / name).is_file()]


def test_the_go_reference_captures_are_inside_the_repository() -> None:
    assert REFERENCE_DIR.is_relative_to(REPO)
    index = (REFERENCE_DIR / "INDEX.txt").read_text()
    captures = [line.split(":", 1)[0] for line in index.splitlines()]
    captures = [name for name in captures if name.endswith(".http")]
    assert len(captures) >= 38
    missing = [name for name in captures if not (REFERENCE_DIR / name).is_file()]
    assert missing == []


def test_no_code_or_build_file_reads_a_path_outside_the_checkout() -> None:
    offenders = []
    for path in _tracked_files("*.py", "Makefile", ".ci/*", "*.toml", "*.cfg"):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE_PATH.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == []


def test_parents_climbs_stop_at_the_repository_root() -> None:
    """`Path(__file__).resolve().parents[N]` must not climb above the checkout."""
    climb = re.compile(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d+)\]")
    offenders = []
    for path in _tracked_files("*.py"):
        depth = len(path.relative_to(REPO).parts) - 1
        for match in climb.finditer(path.read_text()):
            if int(match.group(1)) > depth:
                offenders.append(f"{path.relative_to(REPO)}: parents[{match.group(1)}]")
    assert offenders == []
