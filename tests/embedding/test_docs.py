"""Every Python example in docs/embedding.md runs: scripts in-process, test files through
pytester (which loads the nsqpy plugin from its entry point)."""

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "embedding.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
SCRIPTS = [block for block in BLOCKS if not block.startswith("# test_")]
TEST_FILES = [block for block in BLOCKS if block.startswith("# test_")]


def test_the_doc_has_examples():
    assert len(SCRIPTS) >= 2 and TEST_FILES


@pytest.mark.parametrize("source", SCRIPTS, ids=lambda s: s.splitlines()[0][:40])
def test_script_example_runs(source):
    exec(compile(source, str(DOC), "exec"), {"__name__": "__main__"})


@pytest.mark.parametrize("source", TEST_FILES, ids=lambda s: s.splitlines()[0][2:])
def test_pytest_example_passes(pytester, source):
    pytester.makepyfile(**{source.splitlines()[0][2:].removesuffix(".py"): source})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=source.count("\ndef test_"))
