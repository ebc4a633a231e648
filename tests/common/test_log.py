"""The daemons' log lines: Go's format, and always valid UTF-8."""

import io

from common.goformat import go_text
from common.log import setup_logger
from nsqd.options import Options
from nsqd.server import NSQD


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


def test_an_in_process_nsqds_records_are_printable_for_any_handler(caplog, tmp_path):
    """An embedding program's handlers (here pytest's) get the escaped text too."""
    server = NSQD(
        Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", data_path=str(tmp_path))
    )
    server.log.error("[%s] - %s", "client", "E_BAD_TOPIC " + go_text(b"t\xfe"))
    assert caplog.records[-1].getMessage() == "[client] - E_BAD_TOPIC t\\xfe"
