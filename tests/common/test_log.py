"""The daemons' log lines: Go's format, and always valid UTF-8."""

import io
import signal
import subprocess
import urllib.request

import pytest

from nsqpy.common.goformat import go_text
from nsqpy.daemon.log import parse_flag_log_level, pass_of, setup_logger, youzan_log_level
from nsqpy.nsqd.options import Options
from nsqpy.nsqd.server import NSQD
from tests.cluster.etcd_server import free_port
from tests.harness import BIN
from tests.support.polling import poll


def test_a_byte_that_is_not_utf8_is_logged_as_an_escape():
    stream = io.StringIO()
    log = setup_logger("nsqd.test_log", "[nsqd] ", "info", stream=stream)
    log.error(
        "[%s] - %s", "127.0.0.1:5000", "E_INVALID RDY could not parse count " + go_text(b"\xff")
    )
    log.info("a lone surrogate \ud800 and plain text é")
    first, second = stream.getvalue().splitlines()
    assert first.startswith("[nsqd] ") and " ERROR: [127.0.0.1:5000] - " in first
    assert first.endswith("E_INVALID RDY could not parse count \\xff")
    assert second.endswith("INFO: a lone surrogate \\ud800 and plain text é")
    first.encode("utf-8")
    second.encode("utf-8")


def test_an_internal_error_is_logged_with_its_traceback():
    stream = io.StringIO()
    log = setup_logger("nsqd.test_log_traceback", "[nsqd] ", "info", stream=stream)
    try:
        {}["missing"]
    except KeyError:
        log.exception("PROTOCOL(V2): [%s] internal error, closing the connection", "peer")
    first, *rest = stream.getvalue().splitlines()
    assert first.endswith("ERROR: PROTOCOL(V2): [peer] internal error, closing the connection")
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "KeyError: 'missing'"


def test_an_in_process_nsqds_records_are_printable_for_any_handler(caplog, tmp_path):
    """An embedding program's handlers (here pytest's) get the escaped text too."""
    server = NSQD(
        Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", data_path=str(tmp_path))
    )
    server.log.error("[%s] - %s", "client", "E_BAD_TOPIC " + go_text(b"t\xfe"))
    assert caplog.records[-1].getMessage() == "[client] - E_BAD_TOPIC t\\xfe"


@pytest.mark.parametrize(
    "text,level",
    [("0", "error"), ("1", "warn"), ("2", "info"), ("3", "debug"), ("4", "debug"), ("-1", "error")],
)
def test_youzans_numeric_log_levels(text, level):
    """Youzan's daemons (glog, `levellogger`) take `--log-level=<n>`: 0 error ... 3 debug."""
    assert parse_flag_log_level(text) == level
    assert youzan_log_level(int(text)) == level


def test_log_level_names_stay_gos():
    assert parse_flag_log_level("WARN") == "warn"
    with pytest.raises(ValueError, match="invalid log-level 'loud'"):
        parse_flag_log_level("loud")


@pytest.mark.parametrize("daemon", ["nsqd", "nsqlookupd"])
def test_daemons_take_youzans_glog_flags(tmp_path, daemon):
    """What Youzan's client test scripts pass: `--log-level=1 --alsologtostderr=true`. At
    warn, the listening lines are not logged, so the ports are given."""
    ports = [free_port(), free_port()]
    args = [
        f"-tcp-address=127.0.0.1:{ports[0]}",
        f"-http-address=127.0.0.1:{ports[1]}",
        "--log-level=1",
        "--alsologtostderr=true",
        "-logtostderr",
    ]
    if daemon == "nsqd":
        args.append(f"-data-path={tmp_path}")
    process = subprocess.Popen(
        [str(BIN / daemon), *args], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        reply = poll(lambda: _ping(ports[1]), f"{daemon} answering /ping", timeout=10)
        assert reply == b"OK"
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    assert " INFO: " not in err  # warn and above only


def _ping(port: int) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=1) as response:
            return response.read()
    except OSError:
        return None


def test_the_lines_of_a_pass_go_out_together_in_order():
    """Inside a poller's pass (`pass_of`) the daemon's lines wait for its end and go out
    with one write, in the order they were logged; outside one, each at once."""
    writes: list[str] = []

    class Recorded(io.StringIO):
        def write(self, text: str) -> int:
            writes.append(text)
            return super().write(text)

    stream = Recorded()
    log = setup_logger("nsqd.test_log_pass", "[nsqd] ", "info", stream=stream)
    log.info("before")
    with pass_of(log):
        log.info("one")
        log.error("two")
        assert stream.getvalue().count("\n") == 1
    log.info("after")
    assert [line.rsplit(": ", 1)[1] for line in stream.getvalue().splitlines()] == [
        "before",
        "one",
        "two",
        "after",
    ]
    assert len(writes) == 3
