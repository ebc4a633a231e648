"""The daemons load nothing of the test tooling: `trio.testing` imports pytest when pytest is
installed (8 MiB, and a consume rate 5-8 % lower, measured when a topic pump used it), so a
daemon that imported it would run differently where the tests are installed."""

import subprocess
import sys

DAEMON_MODULES = ["nsqpy.nsqd.server", "nsqpy.nsqlookupd.server", "nsqpy.nsqadmin.app"]


def test_the_daemons_import_neither_pytest_nor_trio_testing():
    script = (
        "import sys\n"
        + "".join(f"import {module}\n" for module in DAEMON_MODULES)
        + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest')"
        " or m.startswith('trio.testing')))"
    )
    found = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert found == "[]", f"the daemons import {found}"
