"""nsq_data_tool, Youzan's offline reader of a partition's data, on the data directory of a
real nsqd: its commit log, messages, delay queue and channel positions, while nsqd runs and
after it stopped; and its refusals."""

import re

from nsqpy.client.blocking import http_request
from nsqpy.common.command import encode_command
from nsqpy.partition_log.view import LogView
from nsqpy.tools.nsq_data_tool import go_entry
from tests.harness import V2Connection, start_nsqd
from tests.support.polling import poll
from tests.tools.support import run_tool

ENTRY = re.compile(r"^\{(-?\d+ ){6}-?\d+\}$")


def data_tool(data_path, *args: str) -> tuple[int, str, str]:
    result = run_tool("nsq_data_tool", "-topic=t", "-partition=0", f"-data_path={data_path}", *args)
    return result.returncode, result.stdout.decode(), result.stderr.decode()


def test_the_tool_reads_a_partitions_log_delay_queue_and_channels(tmp_path):
    daemon = start_nsqd(tmp_path)
    try:
        http = daemon.addresses["HTTP"]
        http_request(http, "/topic/create", method="POST", topic="t", partition_num="1")
        http_request(http, "/channel/create", method="POST", topic="t", channel="c", partition="0")
        for n in range(3):
            http_request(http, "/pub", method="POST", topic="t", partition="0", body=b"m%d" % n)
        connection = V2Connection(daemon.port())
        connection.send(encode_command("DPUB", "t", 60_000, 0, body=b"later"))
        assert connection.read_response().data == b"OK"
        connection.close()

        code, out, err = data_tool(tmp_path, "-view=commitlog", "-view_cnt=10")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].startswith("topic last commit log at 0:")
        assert lines[1].startswith("topic read at: 0:0, {")
        assert len(lines[2:]) == 4 and all(ENTRY.match(line) for line in lines[2:]), out

        code, out, err = data_tool(
            tmp_path, "-view=topicdata", "-search_mode=count", "-view_start=1", "-view_cnt=2"
        )
        assert code == 0, err
        bodies = [line.rpartition(" body: ")[2] for line in out.splitlines() if " body: " in line]
        assert bodies == ["m1", "m2"]

        # The delay queue's index is committed at nsqd's next sync.
        poll(
            lambda: "channel c cnt : 1" in data_tool(tmp_path, "-view=delayedqueue")[1],
            "the DPUB in the delay queue's committed index",
        )
        code, out, err = data_tool(tmp_path, "-view=delayedqueue", "-view_channel=c")
        assert code == 0, err
        assert re.search(r"^peeked channel msg : c \d+ at \d+:3, due in ", out, re.M), out

        code, out, err = data_tool(tmp_path, "-view=channels")
        assert code == 0, err
        assert "channel c confirmed 0:0, acknowledged ranges [], deferred 0" in out.splitlines()
    finally:
        daemon.stop()
    # Offline, the same.
    code, out, err = data_tool(tmp_path, "-view=topicdata", "-view_cnt=4")
    assert code == 0, err
    bodies = [line.rpartition(" body: ")[2] for line in out.splitlines() if " body: " in line]
    assert bodies == ["m0", "m1", "m2", "later"]
    code, out, err = data_tool(tmp_path, "-view=check")
    assert (code, out.splitlines()[1:]) == (0, ["checked 4 groups: 0 corrupt"]), err
    # A group gone bad (zeros where its records were): the check names it and fails.
    view = LogView(str(tmp_path), "t", 0)
    second = view.index.entry(1)
    with open(view.files.segment(0), "r+b") as data:
        data.seek(second[3])
        data.write(bytes(second[4]))
    view.close()
    code, out, err = data_tool(tmp_path, "-view=check")
    assert code == 1, err
    assert out.splitlines()[1:] == [
        f"corrupt group {go_entry(second)}: a record of 0 bytes at offset {second[3]}",
        "checked 4 groups: 1 corrupt",
    ]


def test_the_tool_says_what_it_needs(tmp_path):
    result = run_tool("nsq_data_tool", "-partition=0", f"-data_path={tmp_path}")
    assert result.returncode == 1
    assert "--topic is required" in result.stderr.decode()
    code, _out, err = data_tool(tmp_path, "-view_cnt=1000001")
    assert code == 1 and "--view_cnt is too large" in err
    code, _out, err = data_tool(tmp_path)
    assert code == 1 and "loading commit log failed: no commit log for t partition 0" in err
