"""`--version` of every daemon and utility, in the shape parsers of Go's version line expect."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from nsqpy.common.version import NSQ_PROTOCOL_VERSION, PACKAGE_VERSION, VERSION
from tests.reference import REFERENCE_DIR

BIN = Path(sys.executable).parent
PROGRAMS = [
    "nsqd",
    "nsqlookupd",
    "nsqadmin",
    "nsq_tail",
    "to_nsq",
    "nsq_stat",
    "nsq_to_file",
    "nsq_to_http",
    "nsq_to_nsq",
]
# gnsq's test harness (tests/integration_server.py of gnsq 1.0.2) reads the daemons' versions
# with exactly this pattern, anchored at the start (re.match).
GNSQ_VERSION_PATTERN = re.compile(
    r"(?P<name>[a-z]+) v(?P<version>[0-9]+\.[0-9]+\.[0-9]+)(?:-[a-z]+)? "
    r"\(built w\/(?P<go_version>[a-z0-9.-]+)\)"
)


def _go_shape(go_line: str) -> re.Pattern[str]:
    """Go's line with the toolchain inside the parentheses left open."""
    head, _, _ = go_line.partition(" (built w/")
    return re.compile(re.escape(head) + r" \(built w/[^()\n]+\)\n")


@pytest.mark.parametrize("program", PROGRAMS)
def test_version_line_has_go_shape_and_names_nsqpy_inside_the_parentheses(program: str) -> None:
    result = subprocess.run(
        [str(BIN / program), "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    expected = f"{program} v{NSQ_PROTOCOL_VERSION} (built w/nsqpy-{PACKAGE_VERSION}-python3."
    assert result.stdout.startswith(expected)


@pytest.mark.parametrize("daemon", ["nsqd", "nsqlookupd", "nsqadmin"])
def test_gnsq_harness_reads_the_daemon_version(daemon: str) -> None:
    result = subprocess.run(
        [str(BIN / daemon), "--version"], capture_output=True, text=True, timeout=60
    )
    match = GNSQ_VERSION_PATTERN.match(result.stdout)
    assert match is not None
    assert (match.group("name"), match.group("version")) == (daemon, NSQ_PROTOCOL_VERSION)


@pytest.mark.parametrize("daemon", ["nsqd", "nsqlookupd", "nsqadmin"])
def test_daemon_version_line_matches_the_recorded_go_line(daemon: str) -> None:
    go_line = (REFERENCE_DIR / f"{daemon}_version.txt").read_text()
    result = subprocess.run(
        [str(BIN / daemon), "--version"], capture_output=True, text=True, timeout=60
    )
    assert _go_shape(go_line).fullmatch(result.stdout)


def test_semver_build_metadata_form_is_kept_where_clients_compare_versions() -> None:
    assert VERSION == f"{NSQ_PROTOCOL_VERSION}+nsqpy.{PACKAGE_VERSION}"


@pytest.mark.parametrize(
    ("daemon", "arguments"),
    [
        ("nsqd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]),
        ("nsqlookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]),
        ("nsqadmin", ["--http-address=127.0.0.1:0", "--nsqd-http-address=127.0.0.1:1"]),
    ],
)
def test_daemon_logs_its_version_line_first(daemon: str, arguments: list[str], tmp_path) -> None:
    process = subprocess.Popen(
        [str(BIN / daemon), *arguments],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        first_line = process.stderr.readline()
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)  # a daemon that ignored SIGTERM fails the test
        except subprocess.TimeoutExpired:
            process.kill()  # and is not left running
            process.wait()
            raise
    assert first_line.endswith(
        f"INFO: {daemon} v{NSQ_PROTOCOL_VERSION} (built w/nsqpy-"
        f"{PACKAGE_VERSION}-python{sys.version.split()[0]})\n"
    )
