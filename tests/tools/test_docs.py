"""The shell examples of docs/tools.md run against a real nsqd and nsqlookupd: the default
addresses in them are replaced by the test daemons' ephemeral ones."""

import os
import re
import subprocess
from pathlib import Path

from nsqpy.client.blocking import http_request
from tests.harness import BIN
from tests.support.polling import poll
from tests.support.ports import with_addresses
from tests.tools.support import lookupd_has_topic

DOC = Path(__file__).resolve().parents[2] / "docs" / "tools.md"


def test_tools_doc_shell_examples_run(nsqd, lookupd):
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 3
    http_request(nsqd.addresses["HTTP"], "/topic/create", method="POST", topic="events")
    poll(lambda: lookupd_has_topic(lookupd, "events"))
    replacements = {
        "127.0.0.1:4150": nsqd.addresses["TCP"],
        "127.0.0.1:4151": nsqd.addresses["HTTP"],
        "127.0.0.1:4160": lookupd.addresses["TCP"],
        "127.0.0.1:4161": lookupd.addresses["HTTP"],
    }
    environment = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    outputs = []
    for block in blocks:
        block = with_addresses(block, replacements)
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            capture_output=True,
            timeout=30,
            env=environment,
            check=False,
        )
        assert result.returncode == 0, (block, result.stderr.decode())
        outputs.append(result.stdout.decode())
    # to_nsq, then two nsq_tail runs on one channel: three lines, then the fourth.
    assert outputs[1] == "one\ntwo\nthree\nevents | four\n"
    assert "ingress" in outputs[2]
    # go-nsq options: a publish and a read with --producer-opt/--consumer-opt.
    assert outputs[3] == "five\n"
