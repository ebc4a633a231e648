"""A test module that needs a test-only package that is missing is skipped with a reason
naming it; the rest of the suite still collects and runs."""

from pathlib import Path

pytest_plugins = ["pytester"]

# Makes `import nsq` (pynsq) fail in the inner pytest run as it does where pynsq is missing.
HIDE_PYNSQ = """
import sys


class _HidePynsq:
    def find_spec(self, name, path=None, target=None):
        if name == "nsq" or name.startswith("nsq."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.modules.pop("nsq", None)
sys.meta_path.insert(0, _HidePynsq())
"""


def test_a_missing_optional_package_skips_its_module_with_a_reason(pytester):
    conftest = (Path(__file__).parent / "conftest.py").read_text()
    pytester.makeconftest(HIDE_PYNSQ + conftest)
    pytester.makepyfile(
        test_needs_pynsq="import nsq\n\n\ndef test_reader():\n    assert nsq\n",
        test_plain="def test_runs():\n    assert True\n",
    )
    result = pytester.runpytest_subprocess("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*the test package pynsq is not installed*"])


def test_a_missing_module_that_is_no_test_package_still_fails_collection(pytester):
    conftest = (Path(__file__).parent / "conftest.py").read_text()
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_broken="import no_such_module_anywhere\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*ModuleNotFoundError*no_such_module_anywhere*"])
