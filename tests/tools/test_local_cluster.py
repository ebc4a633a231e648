"""`make run`'s cluster runner: Ctrl-C stops every daemon once and cleanly, so nsqd writes the
messages it holds and they are all there after a restart."""

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.harness import (
    DaemonProcess,
    cluster_stats,
    free_cluster_port_offset,
    pid_listening,
    start_nsqd,
)
from tests.nsqd.test_durability import numbered, publish
from tests.nsqd.test_signals import _consume_all
from tests.nsqlookupd.support import poll

RUNNER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from nsqpy.tools.local_cluster import run
    nsqd = ("nsqd", ["-tcp-address=127.0.0.1:0", "-http-address=127.0.0.1:0"], "nsqd")
    sys.exit(run([nsqd], Path(sys.argv[1])))
    """
)


def test_ctrl_c_stops_the_cluster_cleanly_and_keeps_nsqd_messages(tmp_path) -> None:
    runner = DaemonProcess("python", ["-c", RUNNER, str(tmp_path)], new_session=True)
    runner.start(wait_for=("TCP", "HTTP"))
    try:
        publish(runner.port("TCP"), "t", numbered(50))
        # What a terminal does on Ctrl-C: SIGINT to every process of the foreground job.
        os.killpg(runner.process.pid, signal.SIGINT)
        assert runner.process.wait(30) == 0, runner.log
        assert "exited with status" not in runner.log
    finally:
        runner.kill()

    restarted = start_nsqd(tmp_path)
    try:
        assert _consume_all(restarted.port(), "t", "c", 50) == set(range(50))
    finally:
        restarted.kill()


def test_the_replicated_cluster_command_starts_etcd_nsqlookupd_three_nsqds_and_nsqadmin(tmp_path):
    """`make run-cluster`: every daemon's flags are ones it takes, the nsqds have ports and data
    paths of their own and all join the same cluster through the same etcd."""
    from nsqpy.nsqadmin.options import build_flags as nsqadmin_flags
    from nsqpy.nsqd.options import build_flags as nsqd_flags
    from nsqpy.nsqd.options import options_from_values
    from nsqpy.nsqlookupd.options import build_flags as nsqlookupd_flags
    from nsqpy.tools.local_cluster import replicated_daemons

    daemons = replicated_daemons(tmp_path, "/usr/bin/etcd")
    names = [os.path.basename(name) for name, _args, _url in daemons]
    assert names == ["etcd", "nsqlookupd", "nsqd", "nsqd", "nsqd", "nsqadmin"]
    parsers = {"nsqd": nsqd_flags, "nsqlookupd": nsqlookupd_flags, "nsqadmin": nsqadmin_flags}
    nsqds = []
    for name, args, _url in daemons[1:]:
        values = parsers[name]().parse(args).values
        if name == "nsqd":
            nsqds.append(options_from_values(values))
    assert len({(o.tcp_address, o.http_address, o.rpc_port, o.data_path) for o in nsqds}) == 3
    assert {o.cluster_leadership_addresses for o in nsqds} == {"http://127.0.0.1:2379"}
    assert len({o.node_id for o in nsqds}) == 3


@pytest.mark.parametrize("restart", ["--restart-after=1", "on request"])
def test_the_replicated_cluster_outlives_a_killed_nsqd_and_restarts_it(tmp_path, restart):
    """`make run-cluster`: kill -9 of an nsqd leaves the rest running; the runner says so and
    starts it again, by itself after `--restart-after` or on `restart <n>`."""
    offset = free_cluster_port_offset()
    args = ["-m", "nsqpy.tools.local_cluster", "--replicated", f"--port-offset={offset}"]
    if restart.startswith("--"):
        args.append(restart)
    runner = subprocess.Popen(
        [sys.executable, *args],
        cwd=Path(__file__).parents[2],
        env={**os.environ, "NSQPY_DATA": str(tmp_path)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []

    def pump() -> None:
        for line in runner.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()

    def expect(text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no {text!r} in the runner's output:\n" + "\n".join(seen))

    lookupd = f"127.0.0.1:{4161 + offset}"
    try:
        expect("Ctrl-C stops everything")
        poll(
            lambda: len(cluster_stats(lookupd).get("nsqd_nodes", [])) == 3,
            "three nsqds in the cluster",
            30,
        )
        os.kill(pid_listening(4152 + offset), signal.SIGKILL)
        line = expect("nsqd 2 (tcp://127.0.0.1:")
        assert "killed by SIGKILL; the cluster goes on without it" in line
        if not restart.startswith("--"):
            runner.stdin.write("restart 2\n")
            runner.stdin.flush()
        expect("nsqd 2 started again")
        poll(
            lambda: len(cluster_stats(lookupd).get("nsqd_nodes", [])) == 3,
            "the restarted nsqd back in the cluster",
            30,
        )
        assert runner.poll() is None
    finally:
        os.killpg(runner.pid, signal.SIGINT)
        status = runner.wait(60)
    assert status == 0, "\n".join(seen)
