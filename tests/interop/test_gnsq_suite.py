"""gnsq's own test suite (its source distribution, fetched by `make test`) against our daemons.

Its harness starts `nsqd` and `nsqlookupd` from PATH the way it starts Go's: it parses their
`--version` line with its own pattern, passes double-dash flags with port 0 and TLS files, and
reads the ports from the `listening on` log lines; then its tests drive them with gnsq's
producer, consumer, reader and HTTP clients. Every one of them must pass.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import gnsq

BIN = Path(sys.executable).parent
SUITE = BIN.parent / "gnsq-suite" / "src"


def test_gnsqs_own_suite_passes_against_nsqpy(tmp_path):
    assert (SUITE / "tests").is_dir(), (
        f"gnsq's test suite is not at {SUITE}: `make test` (make install-test) fetches it"
    )
    assert f"version='{gnsq.__version__}'" in (SUITE / "setup.py").read_text().replace('"', "'")
    environment = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:nsqpy",
            # gnsq's own configuration (none), not this repository's, around the checkout.
            "-c",
            str(SUITE / "setup.cfg"),
            "--rootdir",
            str(SUITE),
            "-W",
            "ignore",
            str(SUITE / "tests"),
        ],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 100 and "failed" not in summary, summary
