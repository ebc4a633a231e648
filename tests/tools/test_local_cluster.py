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
    start_cluster_runner,
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


def test_the_replicated_cluster_command_starts_three_etcds_two_lookupds_three_nsqds_nsqadmin(
    tmp_path,
):
    """`make run-cluster`: every daemon's flags are ones it takes, the etcd members form one
    cluster, the nsqds have ports and data paths of their own, all join the same cluster
    through every etcd member, and the nsqds and nsqadmin know both nsqlookupds."""
    from nsqpy.nsqadmin.options import build_flags as nsqadmin_flags
    from nsqpy.nsqd.options import build_flags as nsqd_flags
    from nsqpy.nsqd.options import options_from_values
    from nsqpy.nsqlookupd.options import build_flags as nsqlookupd_flags
    from nsqpy.tools.local_cluster import replicated_daemons

    daemons = replicated_daemons(tmp_path, "/usr/bin/etcd")
    names = [os.path.basename(name) for name, _args, _url in daemons]
    assert names == [*["etcd"] * 3, *["nsqlookupd"] * 2, *["nsqd"] * 3, "nsqadmin"]
    members = [dict(arg.lstrip("-").split("=", 1) for arg in args) for _n, args, _u in daemons[:3]]
    assert len({member["initial-cluster"] for member in members}) == 1
    assert {member["name"] for member in members} == {
        pair.split("=")[0] for pair in members[0]["initial-cluster"].split(",")
    }
    endpoints = ",".join(member["advertise-client-urls"] for member in members)
    parsers = {"nsqd": nsqd_flags, "nsqlookupd": nsqlookupd_flags, "nsqadmin": nsqadmin_flags}
    nsqds, lookupds = [], []
    for name, args, _url in daemons[3:]:
        values = parsers[name]().parse(args).values
        if name == "nsqd":
            nsqds.append(options_from_values(values))
        elif name == "nsqlookupd":
            lookupds.append(values)
        else:
            assert len(values["lookupd_http_address"]) == 2
    assert len({(o.tcp_address, o.http_address, o.rpc_port, o.data_path) for o in nsqds}) == 3
    assert {o.cluster_leadership_addresses for o in nsqds} == {endpoints}
    assert {v["cluster_leadership_addresses"] for v in lookupds} == {endpoints}
    assert len({o.node_id for o in nsqds}) == 3
    assert all(len(o.lookupd_tcp_address) == 2 for o in nsqds)


class ClusterRunner:
    """`python -m nsqpy.tools.local_cluster --replicated` at a free port offset, its output
    read line by line."""

    def __init__(self, data: Path, *extra: str) -> None:
        self.offset = free_cluster_port_offset()
        self.process = start_cluster_runner(data, self.offset, *extra)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def port(self, documented: int) -> int:
        return documented + self.offset

    def expect(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no {text!r} in the runner's output:\n" + "\n".join(self.seen))

    def command(self, line: str) -> None:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def stop(self) -> int:
        os.killpg(self.process.pid, signal.SIGINT)
        return self.process.wait(60)


@pytest.mark.parametrize("restart", ["--restart-after=1", "on request"])
def test_the_replicated_cluster_outlives_a_killed_nsqd_and_restarts_it(tmp_path, restart):
    """`make run-cluster`: kill -9 of an nsqd leaves the rest running; the runner says so and
    starts it again, by itself after `--restart-after` or on `restart <n>`."""
    runner = ClusterRunner(tmp_path, *([restart] if restart.startswith("--") else []))
    lookupd = f"127.0.0.1:{runner.port(4161)}"
    try:
        runner.expect("Ctrl-C stops everything")
        poll(
            lambda: len(cluster_stats(lookupd).get("nsqd_nodes", [])) == 3,
            "three nsqds in the cluster",
            timeout=30,
        )
        os.kill(pid_listening(runner.port(4152)), signal.SIGKILL)
        line = runner.expect("nsqd 2 (tcp://127.0.0.1:")
        assert "killed by SIGKILL; the cluster goes on without it" in line
        if not restart.startswith("--"):
            runner.command("restart 2")
        runner.expect("nsqd 2 started again")
        poll(
            lambda: len(cluster_stats(lookupd).get("nsqd_nodes", [])) == 3,
            "the restarted nsqd back in the cluster",
            timeout=30,
        )
        assert runner.process.poll() is None
    finally:
        status = runner.stop()
    assert status == 0, "\n".join(runner.seen)


def test_the_replicated_cluster_outlives_an_etcd_member_and_its_master_nsqlookupd(tmp_path):
    """`make run-cluster`: nsqlookupd 1 is the master at start, nsqlookupd 2 its standby; an
    etcd member and the master killed (kill -9), the standby is master, and `restart etcd 1`
    and `restart nsqlookupd 1` start them again."""
    runner = ClusterRunner(tmp_path)
    first, second = f"127.0.0.1:{runner.port(4161)}", f"127.0.0.1:{runner.port(4163)}"
    try:
        runner.expect("Ctrl-C stops everything")
        poll(lambda: cluster_stats(first).get("is_master"), "nsqlookupd 1 the master")
        poll(lambda: len(cluster_stats(second).get("nsqd_nodes", [])) == 3, "three nsqds")
        os.kill(pid_listening(runner.port(2379)), signal.SIGKILL)
        assert "killed by SIGKILL" in runner.expect("etcd 1 (http://127.0.0.1:")
        os.kill(pid_listening(runner.port(4161)), signal.SIGKILL)
        assert "killed by SIGKILL" in runner.expect("nsqlookupd 1 (http://127.0.0.1:")
        poll(lambda: cluster_stats(second).get("is_master"), "the standby the master")
        runner.command("restart etcd 1")
        runner.expect("etcd 1 started again")
        runner.command("restart nsqlookupd 1")
        runner.expect("nsqlookupd 1 started again")
        poll(
            lambda: (
                cluster_stats(first).get("master") == cluster_stats(second).get("master")
                and cluster_stats(first).get("control_plane", {}).get("healthy")
            ),
            "nsqlookupd 1 back, following the master, every etcd member answering",
            timeout=30,
        )
        assert runner.process.poll() is None
    finally:
        status = runner.stop()
    assert status == 0, "\n".join(runner.seen)
