"""The daemons' log lines: Go's format, and always valid UTF-8."""

import io

from common.goformat import go_text
from common.log import setup_logger


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
