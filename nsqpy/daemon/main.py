"""What every daemon's console script does around its server: Go's command line, the config
file, Go-format logging, and a trio run that a SIGTERM or SIGINT ends cleanly.

A daemon passes its flag set, how to turn parsed values into options, and how to build its
server (an object with `async serve()` and `shutdown()`); any error a user can cause at start
(a bad flag value, config file, certificate, busy port, corrupt metadata) ends in one log line
and exit status 1, as Go's daemons do, never a traceback.
"""

import logging
import signal
import sys
from collections.abc import Callable
from typing import Any, Protocol

import trio

from nsqpy.common.flags import ConfigError, Flag, FlagSet, Kind, merge, read_config
from nsqpy.common.version import version_line
from nsqpy.daemon.log import parse_flag_log_level, parse_log_level, setup_logger


def standard_flags(log_level: str, log_prefix: str, *, youzan: bool = False) -> list[Flag]:
    """The flags every Go NSQ daemon has: --config, --version, --log-level, --log-prefix and
    the deprecated --verbose. With `youzan` (nsqd and nsqlookupd, whose Youzan versions take
    glog's flags and its clients' test scripts pass them: `--log-level=1`,
    `--alsologtostderr=true`), numeric log levels and those flags too."""
    level_help = "set log verbosity: debug, info, warn, error, or fatal"
    flags = [
        Flag("config", Kind.STRING, "", "path to config file", config_key=None),
        Flag("version", Kind.BOOL, False, "print version string", config_key=None),
        Flag(
            "log-level",
            Kind.VALUE,
            log_level,
            level_help + (" (or Youzan's 0 error, 1 warn, 2 info, 3 debug)" if youzan else ""),
            parse=parse_flag_log_level if youzan else parse_log_level,
            default_text=log_level.upper(),
        ),
        Flag("log-prefix", Kind.STRING, log_prefix, "log message prefix"),
        Flag("verbose", Kind.BOOL, False, "[deprecated] has no effect, use --log-level"),
    ]
    if youzan:
        for name in ("alsologtostderr", "logtostderr"):
            flags.append(
                Flag(
                    name,
                    Kind.BOOL,
                    False,
                    "[Youzan compatibility] has no effect: logs always go to stderr",
                )
            )
    return flags


class Server(Protocol):
    async def serve(self) -> None: ...

    def shutdown(self) -> None: ...


def run_daemon(
    name: str,
    flags: FlagSet,
    options_from_values: Callable[[dict], Any],
    build_server: Callable[[Any, logging.Logger], Server],
    *,
    argv: list[str] | None = None,
    startup_errors: tuple[type[Exception], ...] = (),
    option_errors: tuple[type[Exception], ...] = (ValueError,),
) -> None:
    values, explicitly_set, _args = flags.parse_or_exit(sys.argv[1:] if argv is None else argv)
    if values["version"]:
        print(version_line(name))
        return
    log = setup_logger(name, values["log_prefix"], values["log_level"])
    bad_options: tuple[type[Exception], ...] = (ConfigError, *option_errors)
    unstartable: tuple[type[Exception], ...] = (OSError, *startup_errors)
    try:
        if values["config"]:
            values = merge(values, explicitly_set, read_config(values["config"], flags), flags)
        options = options_from_values(values)
    except bad_options as error:
        log.critical("failed to instantiate %s - %s", name, error)
        sys.exit(1)
    log = setup_logger(name, options.log_prefix, options.log_level)
    # Go's daemons log their version line first; harnesses read the version from it.
    log.info("%s", version_line(name))
    try:
        server = build_server(options, log)
    except OSError as error:  # e.g. a TLS certificate or key that cannot be loaded
        log.critical("failed to instantiate %s - %s", name, error)
        sys.exit(1)
    unstarted: BaseException | None = None
    try:
        trio.run(_serve_until_signal, server)
    except* unstartable as group:
        # A listener that cannot bind, a data path that cannot be created, metadata that
        # cannot be read: one line, exit 1. Not exited from here: before 3.11.4 (Debian 12 has
        # 3.11.2), an exception raised in an `except*` clause left it wrapped in a group with
        # the one handled, and SystemExit printed both as a traceback.
        unstarted = first_leaf(group)
    if unstarted is not None:
        log.critical("%s", unstarted)
        sys.exit(1)


def first_leaf(group: BaseExceptionGroup) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def _serve_until_signal(server: Server) -> None:
    # Held back while the handlers change: a signal that came between the two would meet
    # SIG_IGN and be lost, and the daemon would not stop.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        # What the receiver restores when it closes: a signal that comes once serve() has
        # returned, everything written, is ignored instead of ending the process with 143.
        for signum in _STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        # The receiver stays open for the whole run: closed early, it would hand a signal
        # still pending (a terminal's SIGINT, then a supervisor's SIGTERM) back to the
        # default handler, which kills the process before its messages are on disk.
        with trio.open_signal_receiver(*_STOP_SIGNALS) as signals:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_shutdown_on_signal, server, signals)
                await server.serve()
                nursery.cancel_scope.cancel()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


async def _shutdown_on_signal(server: Server, signals) -> None:
    """The first SIGTERM or SIGINT begins the clean exit; later ones are ignored, as Go's
    daemons ignore them, until serve() has written everything and returned."""
    async for _signal in signals:
        server.shutdown()
