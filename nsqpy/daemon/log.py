"""Logging in Go NSQ's format: `[nsqd] 2026/11/21 23:33:16.123456 INFO: TCP: listening on ...`.

Harnesses read the real ports from these lines (`TCP: listening on 127.0.0.1:PORT`), so the
daemons write them to stderr exactly as Go does: the prefix, Go's log.Ldate|Ltime|Lmicroseconds
timestamp, the level name and the message.
"""

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

# Go's lg levels, by their flag spelling; WARNING is how lg prints warn.
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}
_LEVEL_NAMES = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARNING",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "FATAL",
}


def parse_log_level(text: str) -> str:
    """The `--log-level` flag: a level name, any case (Go's lg.ParseLogLevel)."""
    lowered = text.lower()
    if lowered not in LOG_LEVELS:
        raise ValueError(f"invalid log-level '{text}'")
    return lowered


# Youzan's nsqd and nsqlookupd (glog, `levellogger`) number their levels: 0 error, 1 warn,
# 2 info, 3 debug, 4 detail; its clients' test scripts pass `--log-level=1`.
_YOUZAN_LOG_LEVELS = ("error", "warn", "info", "debug")


def youzan_log_level(number: int) -> str:
    """One of Youzan's numeric levels as ours (debug for 3 and above, error below 0)."""
    return _YOUZAN_LOG_LEVELS[min(max(number, 0), len(_YOUZAN_LOG_LEVELS) - 1)]


def parse_flag_log_level(text: str) -> str:
    """The `--log-level` flag: a level name, any case (Go's lg.ParseLogLevel), or one of
    Youzan's numbers (`youzan_log_level`)."""
    stripped = text.strip()
    if stripped.removeprefix("-").isdigit():
        return youzan_log_level(int(stripped))
    return parse_log_level(text)


class GoFormatter(logging.Formatter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        # The date and time of the last second a line was written in (a connection's life
        # is a handful of lines, thousands a second: the same second's text each time).
        self._second = -1
        self._stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        if seconds != self._second:
            self._stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(seconds))
            self._second = seconds
        stamp = self._stamp
        micros = int((record.created - seconds) * 1_000_000)
        level = _LEVEL_NAMES.get(record.levelno, record.levelname)
        line = f"{self.prefix}{stamp}.{micros:06d} {level}: {record.getMessage()}"
        if record.exc_info:
            # An internal error is only worth logging with the traceback that explains it.
            return f"{line}\n{self.formatException(record.exc_info)}"
        return line


def printable(message: str) -> str:
    """`message` with each byte that was not UTF-8 (a client's bytes decoded with
    surrogateescape, echoed in an error) written as `\\xNN`: a log line is always valid UTF-8,
    for the terminal and for whatever ships the log."""
    try:
        message.encode("utf-8")
        return message
    except UnicodeEncodeError:
        pass
    try:
        return message.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that stood for no byte
        return message.encode("utf-8", "backslashreplace").decode("utf-8")


class _PrintableFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = printable(message)
        if cleaned is not message:
            record.msg, record.args = cleaned, None
        return True


_PRINTABLE = _PrintableFilter()


def keep_printable(logger: logging.Logger) -> logging.Logger:
    """Every record of `logger` made printable (`printable`) before any handler sees it, the
    daemon's own or one an embedding program attached."""
    logger.addFilter(_PRINTABLE)  # once: addFilter skips a filter already there
    return logger


class PassStreamHandler(logging.StreamHandler):
    """A stream handler that writes each line at once, except inside `holding` (one pass of
    a poller): there the pass's lines go out together, with one write when it ends. A
    connection that comes and goes writes four lines, in two or three passes; a write to
    stderr each was a tenth of nsqd's work under such clients (bench/RESULTS.md)."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._held: list[str] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        held = self._held
        if held is None:
            super().emit(record)
            return
        try:
            held.append(self.format(record) + self.terminator)
        except Exception:
            self.handleError(record)

    @contextmanager
    def holding(self) -> Iterator[None]:
        if self._held is not None:
            yield  # within a pass already
            return
        self._held = []
        try:
            yield
        finally:
            self.acquire()
            try:
                lines, self._held = self._held, None
                if lines:
                    self.stream.write("".join(lines))
                    self.flush()
            except Exception:
                # What logging does with a line it cannot write (it says so on stderr).
                self.handleError(logging.makeLogRecord({"msg": "".join(lines or ())}))
            finally:
                self.release()


def pass_of(logger: logging.Logger) -> AbstractContextManager[None]:
    """Around one pass of a poller: the lines the daemon's own handler writes in it go out
    with one write when it ends (`PassStreamHandler`); another handler's at once."""
    for handler in logger.handlers:
        if type(handler) is PassStreamHandler:
            return handler.holding()
    return nullcontext()


def setup_logger(name: str, prefix: str, level: str, stream=None) -> logging.Logger:
    """The daemon's logger, writing Go-format lines to stderr (or `stream`). For the
    process's whole logging (a daemon's or a tool's own process): no record looks up its
    caller's file and line, its thread or its process, which Go's lines do not show and
    which cost a third of a line (a walk up the stack each), and the time of day is written
    once a second: 3.7 against 6.6 µs a line
    (bench/RESULTS.md), and a connection that comes and goes writes five."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logger = logging.getLogger(name)
    logger.handlers.clear()
    handler = PassStreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(GoFormatter(prefix))
    logger.addHandler(handler)
    logger.setLevel(LOG_LEVELS[level])
    logger.propagate = False
    return keep_printable(logger)


def first_error(group: BaseException) -> BaseException:
    """The first error of what an `except*` caught (a group, maybe of groups), for one log
    line; an error that is no group is itself."""
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group
