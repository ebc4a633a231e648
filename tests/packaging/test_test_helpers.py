"""The test suite keeps its helpers in one place (tests/support/ and each directory's support
module): what every test polls, asks over HTTP and starts comes from there, and no test module
borrows from another test module or from a conftest."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
POLLING = TESTS / "support" / "polling.py"
HTTP = TESTS / "support" / "http.py"
HARNESS = TESTS / "harness.py"
POLL_NAMES = {"poll", "wait_until", "until", "_until", "wait_for", "eventually", "poll_until"}


def modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text())) for path in sorted(TESTS.rglob("*.py"))]


def test_no_test_module_imports_another_test_module_or_a_conftest():
    borrowed = []
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                last = node.module.rsplit(".", 1)[-1]
                if node.module.startswith("tests") and (
                    last.startswith("test_") or last == "conftest"
                ):
                    borrowed.append(f"{path.relative_to(TESTS)}: from {node.module}")
    assert borrowed == []


def test_one_polling_helper():
    defined = [
        f"{path.relative_to(TESTS)}: {node.name}"
        for path, tree in modules()
        if path != POLLING
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in POLL_NAMES
    ]
    assert defined == []


def test_one_http_reply_type():
    replies = [
        f"{path.relative_to(TESTS)}: {node.name}"
        for path, tree in modules()
        if path != HTTP
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and node.name.endswith(("Reply", "Response", "Captured"))
        and "status" in ast.unparse(node)
    ]
    assert replies == []


def test_one_starter_per_daemon():
    starters = [
        f"{path.relative_to(TESTS)}: {node.name}"
        for path, tree in modules()
        if path != HARNESS
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name in {"start_lookupd", "start_nsqlookupd", "start_nsqd"}
    ]
    assert starters == []
