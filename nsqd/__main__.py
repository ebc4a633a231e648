"""The `nsqd` console script: Go nsqd's command line, then the daemon until SIGTERM/SIGINT."""

import gc

# Queued messages are long-lived objects; the default gen-0 threshold of 700 makes the
# collector rescan them constantly (about half of publish CPU, bench/RESULTS.md). Raised before
# anything else is imported: importing the broker makes tens of thousands of objects that live
# as long as it does, and collecting every 700 of them took about a tenth of an nsqd's start
# (0.39 -> 0.34 s of CPU to import it, medians of 8 on two cores; every test that starts an
# nsqd pays it).
gc.set_threshold(100_000, 50, 100)

import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

from nsqpy.daemon.main import run_daemon  # noqa: E402
from nsqpy.etcd import EtcdAuthError  # noqa: E402
from nsqpy.nsqd.data_path import DataPathError  # noqa: E402
from nsqpy.nsqd.metadata import MetadataError  # noqa: E402
from nsqpy.nsqd.options import (  # noqa: E402
    Options,
    OptionsError,
    build_flags,
    options_from_values,
    worker_count,
)
from nsqpy.nsqd.worker import (  # noqa: E402
    WORKER_ENVIRONMENT,
    Worker,
    WorkerSetup,
    die_with_parent,
)

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
