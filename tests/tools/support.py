"""Running the NSQ utilities the way a shell does, and asking the daemons about them."""

import signal
import subprocess
import urllib.error

from nsqpy.client.blocking import http_json
from tests.harness import BIN, DaemonProcess


def run_tool(name: str, *args: str, stdin: bytes = b"", timeout: float = 20.0):
    """Run a tool's console script to completion; the CompletedProcess (bytes)."""
    return subprocess.run(
        [str(BIN / name), *args], input=stdin, capture_output=True, timeout=timeout, check=False
    )


def start_tool(name: str, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / name), *args],
        stdin=kwargs.pop("stdin", subprocess.DEVNULL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )


def stop_tool(process: subprocess.Popen, timeout: float = 15.0) -> tuple[bytes, bytes]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err.decode()
    return out, err


def lookupd_has_topic(lookupd: DaemonProcess, topic: str) -> bool:
    try:
        document = http_json(lookupd.addresses["HTTP"], "/lookup", topic=topic)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return False
        raise
    return bool(document.get("producers"))
