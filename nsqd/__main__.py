"""The `nsqd` console script: Go nsqd's command line, then the daemon until SIGTERM/SIGINT."""

import gc
import logging
import os
import sys
from typing import TYPE_CHECKING

from nsqpy.daemon.main import run_daemon
from nsqpy.etcd import EtcdAuthError
from nsqpy.nsqd.data_path import DataPathError
from nsqpy.nsqd.metadata import MetadataError
from nsqpy.nsqd.options import (
    Options,
    OptionsError,
    build_flags,
    options_from_values,
    worker_count,
)
from nsqpy.nsqd.worker import WORKER_ENVIRONMENT, Worker, WorkerSetup, die_with_parent

if TYPE_CHECKING:
    from nsqpy.nsqd.server import NSQD
    from nsqpy.nsqd.supervisor import Supervisor


def _build(options: Options, log: logging.Logger) -> "NSQD | Supervisor":
    setup = os.environ.get(WORKER_ENVIRONMENT)
    if setup is None and worker_count(options.workers) > 1:
        # The supervisor never loads the broker: it stays a small process.
        from nsqpy.nsqd.supervisor import Supervisor

        return Supervisor(options, log, _command_line)
    from nsqpy.nsqd.server import NSQD

    # Queued messages are long-lived objects; the default gen-0 threshold of 700 makes the
    # collector rescan them constantly (about half of publish CPU, bench/RESULTS.md).
    gc.set_threshold(100_000, 50, 100)
    if setup is None:
        return NSQD(options, log)
    # One of a supervisor's workers (`nsqd/worker.py`); its children must not be workers.
    del os.environ[WORKER_ENVIRONMENT]
    die_with_parent()
    return NSQD(options, log, Worker(WorkerSetup(setup)))


# The flags nsqd was started with, which a supervisor starts its workers with.
_command_line: list[str] = []


def main(argv: list[str] | None = None) -> None:
    _command_line[:] = sys.argv[1:] if argv is None else argv
    run_daemon(
        "nsqd",
        build_flags(),
        options_from_values,
        _build,
        argv=argv,
        startup_errors=(MetadataError, DataPathError, EtcdAuthError),
        option_errors=(OptionsError,),
    )


if __name__ == "__main__":
    main()
