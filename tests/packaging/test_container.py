"""The container image and compose.yaml are what an operator expects: an unprivileged user, nsqd's
data on a volume it uses by default, every port exposed, and daemons that find each other.

No Docker daemon runs here, so the files are read as docker reads them; what the image installs
and serves is tested by test_install.py.
"""

import shlex
from pathlib import Path

import yaml

from nsqpy.nsqadmin.options import build_flags as nsqadmin_flags
from nsqpy.nsqd.options import build_flags as nsqd_flags
from nsqpy.nsqlookupd.options import build_flags as nsqlookupd_flags

REPO = Path(__file__).resolve().parents[2]
FLAG_SETS = {"nsqd": nsqd_flags, "nsqlookupd": nsqlookupd_flags, "nsqadmin": nsqadmin_flags}


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped."""
    instructions = []
    pending = ""
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            if pending.strip():
                keyword, _, arguments = pending.strip().partition(" ")
                instructions.append((keyword.upper(), arguments.strip()))
            pending = ""
    return instructions


def last(keyword: str) -> str:
    return [arguments for name, arguments in dockerfile_instructions() if name == keyword][-1]


def exec_form(arguments: str) -> list[str]:
    words = yaml.safe_load(arguments)  # docker's exec form is a JSON array
    assert isinstance(words, list), f"use the exec form: {arguments}"
    return words


def parse_daemon_command(command: list[str]) -> dict:
    daemon, *argv = command
    values, _explicit, rest = FLAG_SETS[daemon]().parse(argv)
    assert rest == [], command
    return values


def compose() -> dict:
    return yaml.safe_load((REPO / "compose.yaml").read_text())


def test_the_image_runs_as_an_unprivileged_user() -> None:
    user = last("USER")
    assert user not in ("root", "0", "0:0")
    created = " ".join(arguments for name, arguments in dockerfile_instructions() if name == "RUN")
    assert f"useradd --system --uid 10001 --gid {user}" in created
    assert f"chown {user}:{user} /data" in created


def test_nsqd_keeps_its_data_on_the_image_volume_by_default() -> None:
    volume = shlex.split(last("VOLUME"))
    command = exec_form(last("CMD"))
    assert command[0] == "nsqd"
    assert parse_daemon_command(command)["data_path"] in volume
    assert last("WORKDIR") in volume


def test_every_daemon_port_is_exposed() -> None:
    exposed = {int(port) for port in last("EXPOSE").split()}
    defaults = set()
    for daemon in FLAG_SETS:
        for name, value in FLAG_SETS[daemon]().defaults().items():
            if name.endswith("_address") and isinstance(value, str) and value.startswith("0.0"):
                defaults.add(int(value.rsplit(":", 1)[1]))
    assert defaults == {4150, 4151, 4152, 4160, 4161, 4171}
    assert defaults <= exposed


def test_compose_daemons_reach_each_other_by_service_name() -> None:
    services = compose()["services"]
    assert set(services) == {"nsqlookupd", "nsqd", "nsqadmin"}
    values = {name: parse_daemon_command(service["command"]) for name, service in services.items()}
    for name, service in services.items():
        assert service["image"] == "nsqpy"
        assert service["command"][0] == name

    lookupd_tcp_port = values["nsqlookupd"]["tcp_address"].rsplit(":", 1)[1]
    lookupd_http_port = values["nsqlookupd"]["http_address"].rsplit(":", 1)[1]
    assert values["nsqd"]["lookupd_tcp_address"] == [f"nsqlookupd:{lookupd_tcp_port}"]
    assert values["nsqadmin"]["lookupd_http_address"] == [f"nsqlookupd:{lookupd_http_port}"]
    # What nsqd registers is what other containers dial: the service name, not a random hostname.
    assert values["nsqd"]["broadcast_address"] == "nsqd"


def test_compose_keeps_nsqd_data_in_a_named_volume_on_the_image_volume() -> None:
    document = compose()
    nsqd = document["services"]["nsqd"]
    data_path = parse_daemon_command(nsqd["command"])["data_path"]
    volume_name, _, target = nsqd["volumes"][0].partition(":")
    assert target == data_path
    assert target in shlex.split(last("VOLUME"))
    assert volume_name in document["volumes"]
