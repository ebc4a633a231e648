"""`make run`: nsqlookupd, nsqd and nsqadmin on localhost, their URLs printed, Ctrl-C stops all.

Each daemon is its own process started from this virtualenv's console scripts. If one of them
exits, the others are stopped and its exit status becomes ours, so a broken daemon is never
hidden behind a cluster that looks up.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
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


def main() -> int:
    data_path = Path(os.environ.get("NSQPY_DATA", tempfile.mkdtemp(prefix="nsqpy-")))
    processes: list[tuple[str, subprocess.Popen]] = []
    for name, args, url in DAEMONS:
        extra = [f"-data-path={data_path}"] if name == "nsqd" else []
        processes.append((name, subprocess.Popen([str(BIN / name), *args, *extra])))
        print(f"{name:<11} {url}", flush=True)
    print(f"nsqd data in {data_path}; Ctrl-C stops everything", flush=True)

    def stop(*_ignored: object) -> None:
        for _name, process in processes:
            if process.poll() is None:
                process.terminate()

    signal.signal(signal.SIGTERM, stop)
    status = 0
    try:
        while all(process.poll() is None for _name, process in processes):
            time.sleep(0.2)
        for name, process in processes:
            if process.returncode is not None and process.returncode != 0:
                print(f"{name} exited with status {process.returncode}", file=sys.stderr)
                status = status or process.returncode
    except KeyboardInterrupt:
        pass
    finally:
        stop()
        for _name, process in processes:
            process.wait()
    return status


if __name__ == "__main__":
    sys.exit(main())
