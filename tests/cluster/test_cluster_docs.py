"""The replicated cluster's documentation runs as written: `make run-cluster`'s runner (etcd,
nsqlookupd, three nsqds, nsqadmin; its documented ports moved by a free offset), then
docs/operations.md's walkthrough and the README's failover demo, every shell block in order,
with the same ports moved."""

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.harness import cluster_stats, free_cluster_port_offset, start_cluster_runner
from tests.support.polling import poll

REPO = Path(__file__).parents[2]


def blocks(document: str, heading: str) -> list[str]:
    """The ```sh blocks of the `heading` section of `document`."""
    text = (REPO / document).read_text()
    section = text[text.index(heading) :]
    end = section.find("\n## ", len(heading))
    section = section if end < 0 else section[:end]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S)


def shift(text: str, offset: int) -> str:
    return re.sub(r"127\.0\.0\.1:(\d+)", lambda match: f"127.0.0.1:{int(match[1]) + offset}", text)


class Runner:
    """`python -m nsqpy.tools.local_cluster --replicated`, as `make run-cluster` runs it."""

    def __init__(self, data: Path) -> None:
        self.offset = free_cluster_port_offset()
        # What the runner and its daemons say, printed at teardown: pytest shows it when the
        # test failed.
        self.log_path = data / "runner.log"
        self._log = open(self.log_path, "w")
        self.process = start_cluster_runner(data, self.offset, stdout=self._log)
        self.lookupd = f"127.0.0.1:{4161 + self.offset}"
        poll(lambda: len(self.stats().get("nsqd_nodes", [])) == 3, "three nsqds", timeout=30)
        poll(lambda: self.stats().get("is_master"), "a master nsqlookupd", timeout=30)

    def stats(self) -> dict:
        return cluster_stats(self.lookupd)

    def run(self, block: str) -> str:
        """The block's output; in a session of its own, so a block that overruns is stopped
        with everything it started (a pipeline's `nsq_tail`), not only its shell."""
        shell = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", shift(block, self.offset)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = shell.communicate(timeout=90)
        finally:
            # Whatever of it is still running (all of it, after a timeout).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()
        assert shell.returncode == 0, (block, err.decode())
        return out.decode()

    def type(self, line: str) -> None:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGINT)
        self.process.wait(60)
        self._log.close()
        print(f"-- the runner's output (offset {self.offset}):")
        print(self.log_path.read_text()[-20000:])


@pytest.fixture
def runner(tmp_path):
    running = Runner(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def test_the_operations_walkthrough_runs_as_written(runner):
    walkthrough = blocks("docs/operations.md", "### Walkthrough")
    assert len(walkthrough) == 5
    outputs = [runner.run(block) for block in walkthrough]
    assert '"leader"' in outputs[2] and '"leaders"' in outputs[2]
    assert outputs[4].strip() == "1000"


def test_the_readmes_failover_demo_runs_as_written(runner):
    demo, control_plane, publish = blocks("README.md", "## A replicated cluster")
    runner.run(demo)
    killed_port = str(4152 + runner.offset)
    # Typed by hand the demo takes longer than the node lease (3 s); run as a script it may not.
    poll(
        lambda: all(
            entry["leader"].split(":")[2] != killed_port for entry in runner.stats()["partitions"]
        ),
        "nsqd 2 leading nothing",
        timeout=10,
    )
    runner.type("restart 2")
    poll(
        lambda: (
            len(runner.stats().get("nsqd_nodes", [])) == 3
            and all(len(entry["isr"]) == 2 for entry in runner.stats()["partitions"])
        ),
        "nsqd 2 back in every ISR",
        timeout=60,
    )
    tail = (
        ".venv/bin/nsq_tail --partitioned --lookupd-http-address=127.0.0.1:4161"
        " --topic=orders --channel=billing -n 2000 | sort -n | uniq | wc -l"
    )
    assert runner.run(tail).strip() == "2000"
    # The control plane's part: the master nsqlookupd and an etcd member killed.
    runner.run(control_plane)
    standby = f"127.0.0.1:{4163 + runner.offset}"
    poll(lambda: cluster_stats(standby).get("is_master"), "the standby the master", timeout=10)
    problems = cluster_stats(standby)["control_plane"]["problems"]
    assert any(f"127.0.0.1:{2379 + runner.offset}" in problem for problem in problems), problems
    runner.run(publish)
    runner.type("restart nsqlookupd 1")
    runner.type("restart etcd 1")
    first = f"127.0.0.1:{4161 + runner.offset}"
    poll(
        lambda: (
            cluster_stats(first).get("master") == cluster_stats(standby).get("master")
            and cluster_stats(standby)["control_plane"]["healthy"]
        ),
        "nsqlookupd 1 and the etcd member back",
        timeout=30,
    )
    # The channel gave the first 2,000 to the first reader: the next 1,000 are what is left.
    tail = tail.replace("127.0.0.1:4161", "127.0.0.1:4163").replace("-n 2000", "-n 1000")
    assert runner.run(tail).strip() == "1000"
