"""docs/RELIABILITY.md names the test behind each promise: every test it names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "RELIABILITY.md"
# `test_name`, `::test_name`, `path/test_file.py::test_name` or `test_name[param]`, in backticks.
_TEST_NAME = re.compile(r"`(?:[\w/]+\.py)?(?:::)?(test_\w+)(?:\[[^\]`]*\])?`")
_TEST_FILE = re.compile(r"`(tests/[\w/]+\.py)")


def _defined_tests() -> set[str]:
    names = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.update(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE))
    return names


def test_every_test_the_reliability_doc_names_exists():
    text = DOC.read_text()
    named = set(_TEST_NAME.findall(text))
    assert len(named) > 30
    missing = named - _defined_tests()
    assert not missing, f"docs/RELIABILITY.md names tests that do not exist: {sorted(missing)}"


def test_every_test_file_the_reliability_doc_names_exists():
    files = set(_TEST_FILE.findall(DOC.read_text()))
    assert files
    missing = [name for name in sorted(files) if not (ROOT / name).exists()]
    assert not missing, missing
