"""py-spy attached to nsqd: a flame graph SVG, or collapsed stacks (`--format raw`) summed up
per function as own and inclusive shares of the samples."""

import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter

from bench._support import BIN


def py_spy() -> str | None:
    found = BIN / "py-spy"
    return str(found) if found.exists() else shutil.which("py-spy")


class Profiler:
    """`py-spy record --pid` until `stop()`. `fmt` is py-spy's: flamegraph (SVG) or raw;
    `extra`: more py-spy flags (`--gil`: only samples holding the GIL; `--native`)."""

    def __init__(
        self, pid: int, output: str, rate: int = 200, fmt: str = "raw", extra: tuple = ()
    ) -> None:
        executable = py_spy()
        if executable is None:
            raise RuntimeError("py-spy not found (.venv/bin/pip install py-spy)")
        self.output = output
        self.rate = rate
        self.process = subprocess.Popen(
            [
                executable,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--format",
                fmt,
                "--function",
                "--output",
                output,
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)  # let it attach
        if self.process.poll() is not None:
            raise RuntimeError(f"py-spy failed: {self.process.stderr.read()}")
        self.started = time.monotonic()

    def stop(self) -> float:
        """Stop sampling, wait for the output; the seconds it sampled."""
        seconds = time.monotonic() - self.started
        self.process.send_signal(signal.SIGINT)
        try:
            _out, err = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _out, err = self.process.communicate()
        if not os.path.exists(self.output):
            raise RuntimeError(f"py-spy wrote no profile:\n{err}")
        return seconds


_FRAME_NAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_PACKAGES = ("nsqd/", "common/", "diskqueue/", "trio/", "bench/")
_OURS = ("nsqd/", "common/", "diskqueue/")


def short_name(frame: str) -> str:
    """`Class.function (path/to/file.py:line)` -> `package/file.py:line Class.function`."""
    match = _FRAME_NAME.match(frame)
    if not match:
        return frame
    path = match["file"]
    for package in _PACKAGES:
        if path.startswith(package):
            break
        index = path.rfind("/" + package)
        if index >= 0:
            path = path[index + 1 :]
            break
    else:
        path = os.path.basename(path)
    line = f":{match['line']}" if match["line"] else ""
    return f"{path}{line} {match['function']}"


def summarize(path: str, rate: int, top: int = 15) -> str:
    """Own and inclusive shares of the main thread's samples (the trio loop: all of nsqd's
    Python work). Other threads are trio's to_thread workers (fsync) and are counted apart."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    samples = other_threads = 0
    with open(path) as raw:
        for line in raw:
            stack, _, count_text = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            count = int(count_text)
            if ";<module> (" not in ";" + stack:  # not the main thread
                other_threads += count
                continue
            frames = [short_name(frame) for frame in stack.split(";")]
            samples += count
            own[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
    if not samples:
        return "    (no samples)"
    lines = [
        f"    {samples} main-thread samples at {rate} Hz (~{samples / rate:.1f} s on CPU;"
        f" py-spy leaves out idle samples), {other_threads} samples in other threads"
        " (trio.to_thread workers)",
        "    own time (the function itself, not its callees):",
    ]
    for name, count in own.most_common(top):
        lines.append(f"      {count / samples:6.1%}  {name}")
    lines.append("    inclusive time (function and callees), nsqd/common/diskqueue only:")
    ours = [
        (name, count)
        for name, count in inclusive.most_common()
        if name.startswith(_OURS) and not name.startswith("nsqd/__main__.py")
    ]
    for name, count in ours[:top]:
        lines.append(f"      {count / samples:6.1%}  {name}")
    return "\n".join(lines)
