"""The package installs cleanly into a fresh virtualenv the way the Dockerfile builds the image.

Copies exactly what the Dockerfile's COPY lines copy into a build directory, runs the
equivalent of its `RUN pip install .` in a new virtualenv made from this Python, then checks
the installed console scripts: every `[project.scripts]` entry exists, the daemons print
their version lines, the image's CMD (`nsqd`) serves `/ping` and exits 0 on SIGTERM, and
nsqadmin finds its templates and static assets (package data) once installed.
"""

import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"HTTP: listening on (\S+)")


def _copy_sources(dockerfile: Path, build_dir: Path) -> list[str]:
    """Copy every `COPY src... dest` source from the repo root into `build_dir`, as docker does
    (dest relative to the WORKDIR; a dest ending in `/` or several sources means "into")."""
    copied = []
    for line in dockerfile.read_text().splitlines():
        if not line.upper().startswith("COPY "):
            continue
        words = shlex.split(line, comments=True)
        args = [word for word in words[1:] if not word.startswith("--")]
        *sources, dest = args
        assert sources and not dest.startswith("/"), line
        for source in sources:
            src = REPO / source
            assert src.exists(), f"Dockerfile copies missing {source!r}"
            target = build_dir / dest
            if dest.endswith("/") or len(sources) > 1:
                target = target / src.name
            target.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, target)
            copied.append(source)
    return copied


def _image_command(dockerfile: Path) -> list[str]:
    """The Dockerfile's last CMD, in its exec (JSON array) form."""
    commands = [line for line in dockerfile.read_text().splitlines() if line.startswith("CMD ")]
    return json.loads(commands[-1].removeprefix("CMD "))


def _clean_env() -> dict[str, str]:
    """The environment without anything that could import the package from this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class _Daemon:
    """An installed daemon with its stderr pumped into a queue, to read its listening line."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=_clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stderr:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def http_address(self, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                raise AssertionError("no HTTP listening line in time:\n" + self.log) from None
            if line is None:
                raise AssertionError(f"exited {self.process.wait()}:\n" + self.log)
            self.lines.append(line)
            match = _LISTENING.search(line)
            if match:
                return match.group(1)

    def terminate(self, timeout: float = 15.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError("did not exit on SIGTERM:\n" + self.log) from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @property
    def log(self) -> str:
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return "\n".join(self.lines)


def _get(url: str, timeout: float = 20.0) -> tuple[int, str, str]:
    """GET `url`, retrying only refused connections until `timeout`; (status, type, body)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=max(deadline - time.monotonic(), 0.1)) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.headers.get("Content-Type", ""), error.read().decode()
        except (ConnectionError, urllib.error.URLError):
            if time.monotonic() >= deadline:
                raise


def test_dockerfile_build_installs_working_console_scripts(tmp_path):
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    copied = _copy_sources(REPO / "Dockerfile", build_dir)
    assert "pyproject.toml" in copied

    # The new virtualenv gets no pip of its own (ensurepip took 9 s of CPU): this one's pip
    # installs into it, as the image's pip installs into the image's Python.
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=_clean_env()
    )
    bin_dir = venv / "bin"
    python = bin_dir / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "."],
        cwd=build_dir,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert install.returncode == 0, install.stdout + install.stderr

    # Run everything from a directory with no sources in it, so only the installed copy imports.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import nsqpy.nsqd, nsqpy.nsqadmin, nsqpy.testing\n"
            "print(nsqpy.nsqd.__file__); print(nsqpy.nsqadmin.__file__)",
        ],
        cwd=run_dir,
        env=_clean_env(),
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr
    site_packages = (venv / "lib").resolve()
    for module_file in where.stdout.split():
        assert Path(module_file).resolve().is_relative_to(site_packages), module_file

    # What the distribution itself put in site-packages (its RECORD): one import package,
    # `nsqpy`, and its metadata; the console scripts go to bin/.
    record = subprocess.run(
        [
            str(python),
            "-c",
            "from importlib.metadata import distribution\n"
            "for f in distribution('nsqpy').files: print(f)",
        ],
        cwd=run_dir,
        env=_clean_env(),
        capture_output=True,
        text=True,
    )
    assert record.returncode == 0, record.stderr
    top_level = {line.split("/")[0] for line in record.stdout.split() if not line.startswith("..")}
    assert top_level == {"nsqpy", "nsqpy-0.1.0.dist-info"}, top_level

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    missing = [name for name in scripts if not os.access(bin_dir / name, os.X_OK)]
    assert not missing, f"console scripts not installed: {missing}"

    for name in ("nsqd", "nsqlookupd", "nsqadmin"):
        version = subprocess.run(
            [str(bin_dir / name), "--version"],
            cwd=run_dir,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert version.returncode == 0, version.stdout + version.stderr
        assert version.stdout.startswith(f"{name} v1.3.0 (built w/nsqpy-"), version.stdout

    data_path = tmp_path / "data"
    data_path.mkdir()
    # The image's own CMD, with the data path and the listeners moved to this test's (later
    # flags win, as in Go).
    program, *image_arguments = _image_command(REPO / "Dockerfile")
    nsqd = _Daemon(
        [
            str(bin_dir / program),
            *image_arguments,
            "-tcp-address=127.0.0.1:0",
            "-http-address=127.0.0.1:0",
            f"-data-path={data_path}",
        ],
        cwd=run_dir,
    )
    nsqadmin = None
    try:
        nsqd_http = nsqd.http_address()
        assert _get(f"http://{nsqd_http}/ping")[::2] == (200, "OK")

        # nsqadmin's templates and static assets are package data: render a page and an asset.
        nsqadmin = _Daemon(
            [
                str(bin_dir / "nsqadmin"),
                "-http-address=127.0.0.1:0",
                f"-nsqd-http-address={nsqd_http}",
            ],
            cwd=run_dir,
        )
        admin_http = nsqadmin.http_address()
        status, content_type, body = _get(f"http://{admin_http}/")
        assert status == 200, body
        assert content_type.startswith("text/html") and "</html>" in body, body
        status, _, body = _get(f"http://{admin_http}/static/nsqadmin.css")
        assert status == 200 and body, body
        assert nsqadmin.terminate() == 0, nsqadmin.log

        assert nsqd.terminate() == 0, nsqd.log
    finally:
        nsqd.kill()
        if nsqadmin is not None:
            nsqadmin.kill()
