"""`make run`'s cluster runner: Ctrl-C stops every daemon once and cleanly, so nsqd writes the
messages it holds and they are all there after a restart."""

import os
import queue
import signal
import socket
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
from tests.nsqd.support import consume_all, numbered, publish
from tests.support.polling import poll

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
        assert consume_all(restarted.port(), "t", "c", 50) == set(range(50))
    finally:
        restarted.kill()


def test_make_run_keeps_its_data_in_one_place_across_restarts(tmp_path) -> None:
    """`make run` twice from the same checkout: the messages nsqd held when Ctrl-C stopped the
    first run are served by the second, from `data/run/` under the checkout."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    offset = free_cluster_port_offset()
    environment = {k: v for k, v in os.environ.items() if k != "NSQPY_DATA"}

    def make_run() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "nsqpy.tools.local_cluster", f"--port-offset={offset}"],
            cwd=checkout,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def wait_for_line(runner: subprocess.Popen, text: str) -> str:
        for line in runner.stdout:
            if text in line:
                return line
        raise AssertionError(f"the runner ended before printing {text!r}")

    def nsqd_listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", 4150 + offset), timeout=1).close()
            return True
        except OSError:
            return False

    first = make_run()
    try:
        line = wait_for_line(first, "nsqd data in ")
        assert line.split("nsqd data in ")[1].split(";")[0] == str(checkout / "data" / "run")
        poll(nsqd_listening, "nsqd listening", timeout=20)
        publish(4150 + offset, "t", numbered(20))
    finally:
        os.killpg(first.pid, signal.SIGINT)
        assert first.wait(30) == 0
    second = make_run()
    try:
        wait_for_line(second, "Ctrl-C stops everything")
        poll(nsqd_listening, "nsqd listening again", timeout=20)
        assert consume_all(4150 + offset, "t", "c", 20) == set(range(20))
    finally:
        os.killpg(second.pid, signal.SIGINT)
        assert second.wait(30) == 0


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
            timeout=30,
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
            timeout=30,
        )
        assert runner.poll() is None
    finally:
        os.killpg(runner.pid, signal.SIGINT)
        status = runner.wait(60)
    assert status == 0, "\n".join(seen)
