"""nsq_pubsub as a process, and what its HTTP and browser tests ask of it."""

from nsqpy.client.blocking import http_json
from tests.harness import DaemonProcess
from tests.support.http import request


def start_pubsub(*args: str, port: int = 0) -> DaemonProcess:
    return DaemonProcess("nsq_pubsub", [f"-http-address=127.0.0.1:{port}", *args]).start(
        wait_for=("HTTP",)
    )


def publish(pubsub: DaemonProcess, topic: str, body: bytes) -> None:
    reply = request(pubsub.addresses["HTTP"], "POST", f"/pub?topic={topic}", body)
    assert (reply.status, reply.body) == (200, b"OK"), reply


def subscribers_of(pubsub: DaemonProcess, topic: str) -> list[dict]:
    return [entry for entry in stats(pubsub)["subscribers"] if entry["topic"] == topic]


def stats(pubsub: DaemonProcess) -> dict:
    return http_json(pubsub.addresses["HTTP"], "/stats", format="json")
