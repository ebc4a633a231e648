"""`make run`'s cluster runner: Ctrl-C stops every daemon once and cleanly, so nsqd writes the
messages it holds and they are all there after a restart."""

import os
import signal
import textwrap

from tests.harness import DaemonProcess, start_nsqd
from tests.nsqd.test_durability import numbered, publish
from tests.nsqd.test_signals import _consume_all

RUNNER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tools.local_cluster import run
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
    from nsqadmin.options import build_flags as nsqadmin_flags
    from nsqd.options import build_flags as nsqd_flags
    from nsqd.options import options_from_values
    from nsqlookupd.options import build_flags as nsqlookupd_flags
    from tools.local_cluster import replicated_daemons

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
