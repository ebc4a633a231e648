"""A real nsqd subprocess for the fuzzers: its ports, its RSS, and the log lines that betray an
internal error (a traceback, "internal error"), kept without holding the whole log."""

import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_LISTENING = re.compile(r"(TCP|HTTP): listening on (\S+)")
# What nsqd logs when a handler raised something other than ProtocolError/HTTPError.
_INTERNAL = re.compile(r"internal error")

MAX_KEPT_LINES = 50


@dataclass
class RSSSampler:
    """VmRSS of a process, sampled every `interval` seconds by a thread."""

    pid: int
    interval: float = 0.5
    samples: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> int:
        """The RSS in KiB now (0 once the process is gone)."""
        try:
            with open(f"/proc/{self.pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
        return 0

    def start(self) -> "RSSSampler":
        self.samples.append(self.read())
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(self.read())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.read())

    @property
    def peak(self) -> int:
        return max(self.samples)


class NSQDProcess:
    """nsqd on ephemeral localhost ports, started from this virtualenv."""

    def __init__(self, data_path: Path, *extra: str) -> None:
        self.data_path = Path(data_path)
        self.args = [
            str(Path(sys.executable).parent / "nsqd"),
            "-tcp-address=127.0.0.1:0",
            "-http-address=127.0.0.1:0",
            f"-data-path={data_path}",
            *extra,
        ]
        self.addresses: dict[str, str] = {}
        self.internal_errors: list[str] = []
        self.health_lines: list[str] = []
        self.internal_error_count = 0
        self.line_count = 0
        self.tail: list[str] = []
        self._ready = threading.Condition()
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "NSQDProcess":
        self.process = subprocess.Popen(
            self.args,
            cwd=self.data_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        threading.Thread(target=self._pump, daemon=True).start()
        deadline = time.monotonic() + timeout
        with self._ready:
            while not {"TCP", "HTTP"} <= self.addresses.keys():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.process.poll() is not None:
                    raise RuntimeError("nsqd did not start:\n" + "\n".join(self.tail))
                self._ready.wait(remaining)
        return self

    def _pump(self) -> None:
        detail_lines = 0
        for line in self.process.stderr:
            self.line_count += 1
            if detail_lines:  # the traceback that follows an internal error
                detail_lines -= 1
                self.internal_errors.append("    " + line.rstrip("\n"))
            self.tail = [*self.tail[-20:], line.rstrip("\n")]
            if "NSQ: health" in line and len(self.health_lines) < MAX_KEPT_LINES:
                # Why /ping said NOK, for a failure message.
                self.health_lines.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match:
                with self._ready:
                    self.addresses[match.group(1)] = match.group(2)
                    self._ready.notify_all()
            if _INTERNAL.search(line):
                self.internal_error_count += 1
                if len(self.internal_errors) < MAX_KEPT_LINES:
                    self.internal_errors.append(line.rstrip("\n"))
                    detail_lines = 20
        with self._ready:
            self._ready.notify_all()

    def port(self, kind: str) -> int:
        return int(self.addresses[kind].rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
