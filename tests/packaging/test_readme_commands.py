"""Every shell snippet of the README runs as written, as far as a test can run it: the daemon
commands start and find each other (on ephemeral ports instead of the defaults), `make`
targets exist and dry-run, `python -m` modules import, and the `docker run` commands pass
flags the daemons accept. The Python snippets run in full in tests/spark/test_readme.py."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

from nsqpy.nsqadmin.options import build_flags as nsqadmin_flags
from nsqpy.nsqd.options import build_flags as nsqd_flags
from nsqpy.nsqlookupd.options import build_flags as nsqlookupd_flags
from tests.harness import DaemonProcess
from tests.support.http import get_json, request
from tests.support.polling import poll

REPO = Path(__file__).resolve().parents[2]
FLAG_SETS = {"nsqd": nsqd_flags, "nsqlookupd": nsqlookupd_flags, "nsqadmin": nsqadmin_flags}
DAEMON_LISTENERS = {
    "nsqlookupd": (["-tcp-address=127.0.0.1:0", "-http-address=127.0.0.1:0"], ("TCP", "HTTP")),
    "nsqd": (["-tcp-address=127.0.0.1:0", "-http-address=127.0.0.1:0"], ("TCP", "HTTP")),
    "nsqadmin": (["-http-address=127.0.0.1:0"], ("HTTP",)),
}


def shell_commands() -> list[list[str]]:
    """Every command line of the README's ```sh blocks, continuations joined, comments cut."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def commands_of(program: str) -> list[list[str]]:
    return [words for words in shell_commands() if words[0] == program]


def test_every_readme_command_is_one_this_test_knows_how_to_check() -> None:
    # The replicated cluster's failover demo (curl, seq, kill, the tools) runs in full in
    # tests/cluster/test_cluster_docs.py.
    demo = {"curl", "seq", "kill", ".venv/bin/to_nsq"}
    known = {"make", "docker", *demo, *(f".venv/bin/{name}" for name in [*FLAG_SETS, "python"])}
    assert {words[0] for words in shell_commands()} <= known


def test_readme_make_targets_exist(tmp_path) -> None:
    targets = {words[1] for words in commands_of("make")}
    assert {"run", "test"} <= targets
    for target in sorted(targets):
        result = subprocess.run(
            ["make", "-n", target], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, (target, result.stderr)


def test_readme_python_modules_import() -> None:
    for words in commands_of(".venv/bin/python"):
        assert words[1] == "-m", words
        result = subprocess.run(
            [sys.executable, "-c", f"import {words[2]}"], cwd=REPO, capture_output=True, text=True
        )
        assert result.returncode == 0, (words, result.stderr)


def test_readme_daemon_commands_start_and_find_each_other(tmp_path) -> None:
    """The README's three daemon commands, in order, each with its default addresses moved to
    the ephemeral ports of the daemons started before it."""
    daemon_commands = [w for w in shell_commands() if w[0].removeprefix(".venv/bin/") in FLAG_SETS]
    started: dict[str, DaemonProcess] = {}
    try:
        for words in daemon_commands:
            name = words[0].removeprefix(".venv/bin/")
            if name in started:
                continue
            arguments = " ".join(words[1:])
            if "nsqlookupd" in started:
                lookupd = started["nsqlookupd"]
                arguments = arguments.replace("127.0.0.1:4160", lookupd.addresses["TCP"])
                arguments = arguments.replace("127.0.0.1:4161", lookupd.addresses["HTTP"])
            listeners, wait_for = DAEMON_LISTENERS[name]
            data = tmp_path / name
            data.mkdir()
            started[name] = DaemonProcess(name, [*arguments.split(), *listeners], cwd=data).start(
                wait_for=wait_for
            )
        assert set(started) == set(FLAG_SETS)
        lookupd_http = started["nsqlookupd"].port("HTTP")
        poll(lambda: get_json(lookupd_http, "/nodes")["producers"], "nsqd registered")
        page = request(started["nsqadmin"].port("HTTP"), "GET", "/nodes")
        assert page.status == 200
        assert f":{started['nsqd'].port('HTTP')}" in page.body.decode()
    finally:
        for daemon in reversed(list(started.values())):
            assert daemon.stop() == 0, daemon.log


def test_readme_docker_run_commands_pass_flags_the_daemons_accept() -> None:
    runs = [words for words in commands_of("docker") if words[1] == "run"]
    assert {words[words.index("nsqpy") + 1] for words in runs} == set(FLAG_SETS)
    for words in runs:
        daemon, *arguments = words[words.index("nsqpy") + 1 :]
        _values, _explicit, rest = FLAG_SETS[daemon]().parse(arguments)
        assert rest == [], words
