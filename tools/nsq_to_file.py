"""nsq_to_file: archive topics to files, one message per line, as Go's `nsq_to_file` does.

Files are named by `--filename-format` (Go's default `<TOPIC>.<HOST><REV>.<DATETIME>.log`,
`.gz` appended with `--gzip`); `<REV>` is `-000000`, `-000001`, ... and is required (kept)
only when gzip, rotation or a separate `--work-dir` is on, otherwise removed. A file is rotated
when the `<DATETIME>` text changes (`--datetime-format`, strftime), after `--rotate-interval`,
or past `--rotate-size` bytes (uncompressed). Messages are FINished only once the file has
been fsynced: every `--max-in-flight` messages, whenever the topic runs dry, every
`--sync-interval`, and on exit. With gzip each sync ends one gzip member and starts the next
(a concatenated gzip stream, readable by `zcat`), as Go does.

Without `--topic`, Go's topic discovery: every topic the lookupds list that matches
`--topic-pattern` is archived, the list being fetched again every `--topic-refresh`.
"""

import gzip
import os
import re
import socket
import sys
import time
import urllib.error
from typing import BinaryIO

from nsqpy.client.blocking import http_json
from nsqpy.common.flags import Flag, Kind
from nsqpy.tools._common import (
    WAKE_INTERVAL,
    ConsumerGroup,
    Progress,
    StopFlag,
    address_flags,
    check_sources,
    consumer_opt_flag,
    fatal,
    log_flags,
    make_logger,
    parse_args,
)
from nsqpy.tools._options import consumer_settings

NAME = "nsq_to_file"


def flags() -> list[Flag]:
    return [
        Flag("topic", Kind.STRING_LIST, (), "nsq topic (may be given multiple times)"),
        Flag("channel", Kind.STRING, "nsq_to_file", "nsq channel"),
        Flag("max-in-flight", Kind.INT, 200, "max number of messages to allow in flight"),
        *address_flags(),
        consumer_opt_flag(),
        Flag("output-dir", Kind.STRING, "/tmp", "directory to write output files to"),
        Flag(
            "work-dir",
            Kind.STRING,
            "",
            "directory for in-progress files before moving to output-dir",
        ),
        Flag(
            "datetime-format",
            Kind.STRING,
            "%Y-%m-%d_%H",
            "strftime compatible format for <DATETIME> in filename format",
        ),
        Flag(
            "filename-format",
            Kind.STRING,
            "<TOPIC>.<HOST><REV>.<DATETIME>.log",
            "output filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV> are replaced. "
            "<REV> is increased when file already exists)",
        ),
        Flag(
            "host-identifier",
            Kind.STRING,
            "",
            "value to output in log filename in place of hostname. "
            "<SHORT_HOST> and <HOSTNAME> are valid replacement tokens",
        ),
        Flag(
            "gzip-level",
            Kind.INT,
            6,
            "gzip compression level (1-9, 1=BestSpeed, 9=BestCompression)",
        ),
        Flag("gzip", Kind.BOOL, False, "gzip output files."),
        Flag("skip-empty-files", Kind.BOOL, False, "skip writing empty files"),
        Flag(
            "rotate-size",
            Kind.INT64,
            0,
            "rotate the file when it grows bigger than `rotate-size` bytes",
        ),
        Flag("rotate-interval", Kind.DURATION, 0.0, "rotate the file every duration"),
        Flag(
            "topic-refresh",
            Kind.DURATION,
            60.0,
            "how frequently the topic list should be refreshed",
        ),
        Flag(
            "topic-pattern",
            Kind.STRING,
            "",
            "only log topics matching the following pattern",
        ),
        Flag("sync-interval", Kind.DURATION, 30.0, "sync file to disk every duration"),
        *log_flags(NAME),
    ]


def filename_format(values: dict, topic: str) -> str:
    """Go's computeFilenameFormat: the format with everything but <DATETIME> and <REV>
    filled in; ValueError when <REV> is needed and missing."""
    hostname = socket.gethostname()
    short_hostname = hostname.split(".")[0]
    identifier = short_hostname
    if values["host_identifier"]:
        identifier = values["host_identifier"].replace("<SHORT_HOST>", short_hostname)
        identifier = identifier.replace("<HOSTNAME>", hostname)
    result = values["filename_format"]
    if (
        values["gzip"]
        or values["rotate_size"] > 0
        or values["rotate_interval"] > 0
        or values["work_dir"] != values["output_dir"]
    ):
        if "<REV>" not in result:
            raise ValueError(
                "missing <REV> in --filename-format when gzip, rotation, or work dir enabled"
            )
    else:
        result = result.replace("<REV>", "")
    result = result.replace("<TOPIC>", topic).replace("<HOST>", identifier)
    result = result.replace("<PID>", str(os.getpid()))
    if values["gzip"] and not result.endswith(".gz"):
        result += ".gz"
    return result


class FileLogger:
    """One topic's current output file: writes, syncs, rotates, moves finished files."""

    def __init__(self, values: dict, topic: str, log) -> None:
        self.values = values
        self.topic = topic
        self.log = log
        self.format = filename_format(values, topic)
        self.work_dir = values["work_dir"]
        self.output_dir = values["output_dir"]
        # The open file, and what writes into it (the file, or a gzip member over it).
        self.out: BinaryIO | None = None
        self.writer: BinaryIO | gzip.GzipFile | None = None
        self.filename = ""
        self.path = ""
        self.rev = 0
        self.open_time = 0.0
        self.filesize = 0
        self.pending: list = []

    def current_filename(self) -> str:
        return self.format.replace("<DATETIME>", time.strftime(self.values["datetime_format"]))

    def needs_rotation(self) -> bool:
        if self.out is None:
            return True
        if self.current_filename() != self.filename:
            return True
        interval = self.values["rotate_interval"]
        if interval > 0 and time.monotonic() - self.open_time > interval:
            return True
        size = self.values["rotate_size"]
        return size > 0 and self.filesize > size

    def write(self, body: bytes) -> None:
        writer = self.writer
        assert writer is not None  # the file is opened before a message is written
        writer.write(body)
        writer.write(b"\n")
        self.filesize += len(body) + 1

    def sync(self) -> list:
        """Make what was written durable; the messages that may now be FINished."""
        if self.out is not None:
            if isinstance(self.writer, gzip.GzipFile):
                # End this gzip member (its trailer checksums what was ACKed) and start the
                # next: the file is a concatenated gzip stream.
                self.writer.close()
                self.out.flush()
                os.fsync(self.out.fileno())
                self._start_gzip()
            else:
                self.out.flush()
                os.fsync(self.out.fileno())
        done, self.pending = self.pending, []
        return done

    def _start_gzip(self) -> None:
        self.writer = gzip.GzipFile(
            filename="",
            mode="wb",
            compresslevel=self.values["gzip_level"],
            fileobj=self.out,
            mtime=0,
        )

    def close(self) -> None:
        if self.out is None:
            return
        if isinstance(self.writer, gzip.GzipFile):
            self.writer.close()
        self.out.flush()
        os.fsync(self.out.fileno())
        empty = self.filesize == 0 and os.fstat(self.out.fileno()).st_size == 0
        self.out.close()
        self.out = None
        if empty and self.values["skip_empty_files"]:
            os.remove(self.path)
            return
        if self.work_dir != self.output_dir:
            self._move_to_output()

    def _move_to_output(self) -> None:
        relative = os.path.relpath(self.path, self.work_dir)
        destination = os.path.join(self.output_dir, relative)
        rev = self.rev
        while True:
            try:
                # Go's exclusiveRename: link then unlink, so an existing file is never replaced.
                os.link(self.path, destination)
                break
            except FileExistsError:
                self.log.warning(
                    "[%s/%s] destination file already exists: %s",
                    self.topic,
                    self.values["channel"],
                    destination,
                )
                rev += 1
                name = self.filename.replace("<REV>", f"-{rev:06d}")
                destination = os.path.join(self.output_dir, os.path.dirname(relative), name)
        os.remove(self.path)

    def update_file(self) -> None:
        self.close()
        filename = self.current_filename()
        if filename != self.filename:
            self.rev = 0
        else:
            self.rev += 1
        self.filename = filename
        self.open_time = time.monotonic()
        full_path = os.path.join(self.work_dir, filename)
        os.makedirs(os.path.dirname(full_path) or ".", mode=0o770, exist_ok=True)
        exclusive = self.values["gzip"] or self.values["rotate_interval"] > 0
        while True:
            path = full_path.replace("<REV>", f"-{self.rev:06d}")
            if self.work_dir != self.output_dir:
                output_path = os.path.join(self.output_dir, os.path.relpath(path, self.work_dir))
                os.makedirs(os.path.dirname(output_path) or ".", mode=0o770, exist_ok=True)
                if os.path.exists(output_path):
                    self.rev += 1
                    continue
            try:
                out = open(path, "xb" if exclusive else "ab")  # noqa: SIM115 (kept open)
            except FileExistsError:
                self.rev += 1
                continue
            self.filesize = os.fstat(out.fileno()).st_size
            size = self.values["rotate_size"]
            if size > 0 and self.filesize > size:
                out.close()
                self.rev += 1
                continue
            break
        self.log.debug("[%s/%s] opening %s", self.topic, self.values["channel"], path)
        self.out = out
        self.path = path
        if self.values["gzip"]:
            self._start_gzip()
        else:
            self.writer = self.out


class TopicDiscoverer:
    """Go's topic discoverer: with no --topic, the topics every lookupd knows (`/topics`),
    fetched again every --topic-refresh; only those matching --topic-pattern (a regular
    expression searched anywhere in the name, like Go's regexp.MatchString) are archived."""

    def __init__(self, values: dict, pattern: re.Pattern | None, log) -> None:
        self.lookupds = list(values["lookupd_http_address"])
        self.pattern = pattern
        self.refresh = values["topic_refresh"]
        self.log = log
        self.next_refresh = 0.0

    def allowed(self, topic: str) -> bool:
        if self.pattern is None:
            return True
        if self.pattern.search(topic) is None:
            self.log.debug(
                "skipping topic %s (doesn't match pattern %s)", topic, self.pattern.pattern
            )
            return False
        return True

    def due(self) -> bool:
        return time.monotonic() >= self.next_refresh

    def lookup(self) -> list[str]:
        """Every lookupd's topics (Go's GetLookupdTopics: union, sorted); errors are logged."""
        self.next_refresh = time.monotonic() + self.refresh
        topics: set[str] = set()
        for lookupd in self.lookupds:
            try:
                topics.update(http_json(lookupd, "/topics").get("topics") or [])
            except (OSError, ValueError, urllib.error.URLError) as error:
                self.log.error("could not retrieve topic list: %s - %s", lookupd, error)
        return sorted(topics)


def main(argv: list[str] | None = None) -> int:
    values = parse_args(NAME, flags(), argv)
    log = make_logger(NAME, values)
    # Go's checks, in Go's order.
    check_sources(log, values)
    if values["gzip_level"] < 1 or values["gzip_level"] > 9:
        fatal(log, "invalid --gzip-level value (%d), should be 1-9", values["gzip_level"])
    if not values["topic"] and not values["topic_pattern"]:
        fatal(log, "--topic or --topic-pattern required")
    if not values["topic"] and not values["lookupd_http_address"]:
        fatal(log, "--lookupd-http-address must be specified when no --topic specified")
    if values["topic_refresh"] <= 0:
        fatal(log, "--topic-refresh must be positive")
    pattern = None
    if values["topic_pattern"]:
        try:
            pattern = re.compile(values["topic_pattern"])
        except re.error as error:
            fatal(log, "invalid --topic-pattern %r - %s", values["topic_pattern"], error)
    if not values["work_dir"]:
        values["work_dir"] = values["output_dir"]
    settings = consumer_settings(log, values, f"{NAME}/nsqpy")
    values["max_in_flight"] = settings["max_in_flight"]
    try:
        filename_format(values, "<TOPIC>")  # a bad --filename-format fails now, not later
    except ValueError as error:
        fatal(log, "%s", error)
    discoverer = TopicDiscoverer(values, pattern, log)
    # --topic: those (that match --topic-pattern, if given), never refreshed; otherwise
    # the lookupds' topics, refreshed every --topic-refresh.
    discovering = not values["topic"]
    topics = [] if discovering else [t for t in values["topic"] if discoverer.allowed(t)]
    loggers = {topic: FileLogger(values, topic, log) for topic in topics}
    stop = StopFlag()
    group = ConsumerGroup(
        topics,
        values["channel"],
        nsqd_tcp_addresses=values["nsqd_tcp_address"],
        lookupd_http_addresses=values["lookupd_http_address"],
        log=log,
        **settings,
    )

    def refresh_topics() -> None:
        for topic in discoverer.lookup():
            if topic not in loggers and discoverer.allowed(topic):
                log.info("new topic %s", topic)
                loggers[topic] = FileLogger(values, topic, log)
                group.add_topic(topic)

    progress = Progress()
    sync_interval = values["sync_interval"]
    next_tick = time.monotonic() + sync_interval

    def finish_all(done: list) -> None:
        for message in done:
            group.finish(message)

    def handle(message) -> None:
        logger = loggers[message.consumer.topic]
        if logger.needs_rotation():
            logger.update_file()
            finish_all(logger.sync())
        logger.write(message.body)
        logger.pending.append(message)
        progress.add()
        if len(logger.pending) >= values["max_in_flight"]:
            finish_all(logger.sync())

    try:
        while not stop:
            if discovering and discoverer.due():
                refresh_topics()
            message = group.receive(timeout=min(WAKE_INTERVAL, sync_interval))
            if message is not None:
                handle(message)
            else:
                # Starved: make what we have durable and acknowledge it.
                for logger in loggers.values():
                    if logger.pending:
                        finish_all(logger.sync())
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + sync_interval
                for logger in loggers.values():
                    if logger.needs_rotation():
                        if values["skip_empty_files"]:
                            finish_all(logger.sync())
                            logger.close()
                        else:
                            finish_all(logger.sync())
                            logger.update_file()
                    finish_all(logger.sync())
        group.start_close()
        for message in group.drain():
            handle(message)
        for logger in loggers.values():
            finish_all(logger.sync())
            logger.close()
    except OSError as error:
        fatal(log, "writing message to disk: %s", error)
    finally:
        progress.close()
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
