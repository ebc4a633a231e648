"""`make run`: nsqlookupd, nsqd and nsqadmin on localhost, their URLs printed, Ctrl-C stops all.

Each daemon is its own process started from this virtualenv's console scripts. If one of them
exits, the others are stopped and its exit status becomes ours, so a broken daemon is never
hidden behind a cluster that looks up. Ctrl-C (or SIGTERM) stops each daemon once, cleanly: nsqd
writes the messages it holds before it exits.
"""

import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

BIN = Path(sys.executable).parent

DAEMONS = [
    (
        "nsqlookupd",
        ["-tcp-address=127.0.0.1:4160", "-http-address=127.0.0.1:4161"],
        "http://127.0.0.1:4161",
    ),
    (
        "nsqd",
        [
            "-tcp-address=127.0.0.1:4150",
            "-http-address=127.0.0.1:4151",
            "-lookupd-tcp-address=127.0.0.1:4160",
            "-broadcast-address=127.0.0.1",
        ],
        "tcp://127.0.0.1:4150  http://127.0.0.1:4151",
    ),
    (
        "nsqadmin",
        ["-http-address=127.0.0.1:4171", "-lookupd-http-address=127.0.0.1:4161"],
        "http://127.0.0.1:4171",
    ),
]


def run(daemons: list[tuple[str, list[str], str]], data_path: Path) -> int:
    """Start `daemons` (console script, arguments, URL to print), wait until one of them exits
    or a SIGINT/SIGTERM arrives, then stop the rest once and wait for every one of them.

    The children run in sessions of their own, so a terminal's Ctrl-C reaches this runner
    alone and each daemon gets exactly one SIGTERM from it: a second signal would find nsqd
    still writing its memory queues, and the runner does not hurry it.
    """
    stop_requested = threading.Event()

    def request_stop(_signum: int, _frame: object) -> None:
        stop_requested.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)

    processes: list[tuple[str, subprocess.Popen]] = []
    try:
        for name, args, url in daemons:
            extra = [f"-data-path={data_path}"] if name == "nsqd" else []
            command = [str(BIN / name), *args, *extra]
            processes.append((name, subprocess.Popen(command, start_new_session=True)))
            print(f"{name:<11} {url}", flush=True)
        print(f"nsqd data in {data_path}; Ctrl-C stops everything", flush=True)
        while not stop_requested.wait(0.2):
            if any(process.poll() is not None for _name, process in processes):
                break
    finally:
        for _name, process in processes:
            if process.poll() is None:
                process.terminate()
        for _name, process in processes:
            process.wait()
    status = 0
    for name, process in processes:
        if process.returncode != 0:
            print(f"{name} exited with status {process.returncode}", file=sys.stderr)
            status = status or process.returncode
    return status


def main() -> int:
    data_path = Path(os.environ.get("NSQPY_DATA", tempfile.mkdtemp(prefix="nsqpy-")))
    return run(DAEMONS, data_path)


if __name__ == "__main__":
    sys.exit(main())
