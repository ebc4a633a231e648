"""No `except X` guards a nursery it cannot see into (tests/packaging/nursery_guards.py): trio
groups whatever a nursery's child raises, so such a handler lets the error end the daemon.
nsqlookupd exited so when its etcd lease was lost (`LeaseLost` raised by the lease's keeper
inside the campaign's nursery, past `except (EtcdError, EtcdAuthError, LeaseLost)`)."""

import textwrap
from pathlib import Path

from tests.packaging.nursery_guards import Program

REPO = Path(__file__).resolve().parents[2]
# Every folder of the product (docs/design.md §1); tests and benchmarks are not it.
PRODUCT = [
    "common",
    "diskqueue",
    "partition_log",
    "nsqd",
    "nsqlookupd",
    "nsqadmin",
    "tools",
    "nsqpy",
]


def module_of(path: Path, root: Path = REPO) -> str:
    """The module name a file installs as (`nsqd/cluster.py` -> `nsqpy.nsqd.cluster`)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[0] != "nsqpy":
        parts = ["nsqpy", *parts]
    return ".".join(parts)


def program_of(root: Path, folders: list[str]) -> Program:
    files = [path for folder in folders for path in sorted((root / folder).rglob("*.py"))]
    return Program(root, files, lambda path: module_of(path, root))


def test_no_plain_except_guards_a_nursery_in_the_product():
    findings = program_of(REPO, PRODUCT).findings()
    assert not findings, "\n".join(str(finding) for finding in findings)


def write(root: Path, name: str, source: str) -> None:
    path = root / "nsqpy" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))


def test_the_checker_finds_the_lost_lease_handler(tmp_path):
    """The campaign as it was: a keeper raising LeaseLost inside the nursery the handler
    guards; and the same through a call of a method that opens the nursery."""
    write(
        tmp_path,
        "coordinator.py",
        """
        import trio
        from nsqpy.etcd import LeaseLost, keep_lease_alive

        class Coordinator:
            async def _campaign(self):
                while True:
                    try:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(keep_lease_alive)
                    except (OSError, LeaseLost) as error:
                        print(error)

            async def _lead(self):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._balance)

            async def _stand(self):
                try:
                    await self._lead()
                except LeaseLost:
                    pass
        """,
    )
    findings = program_of(tmp_path, ["nsqpy"]).findings()
    assert [(finding.function, finding.handler) for finding in findings] == [
        ("Coordinator._campaign", "OSError, LeaseLost"),
        ("Coordinator._stand", "LeaseLost"),
    ]
    assert "calls Coordinator._lead" in findings[1].nursery


def test_the_checker_follows_attributes_and_imports_and_accepts_what_sees_groups(tmp_path):
    write(
        tmp_path,
        "session.py",
        """
        import trio

        class Session:
            async def run(self):
                async with trio.open_nursery():
                    pass

        async def serve(listeners):
            await trio.serve_listeners(None, listeners)
        """,
    )
    write(
        tmp_path,
        "node.py",
        """
        from nsqpy import session
        from nsqpy.session import Session, serve

        class Node:
            def __init__(self):
                self.session = Session()

            async def through_an_attribute(self):
                try:
                    await self.session.run()
                except ValueError:
                    pass

            async def through_a_module(self):
                try:
                    await session.serve([])
                except KeyError:
                    pass

            async def seen(self):
                try:
                    await serve([])
                except* KeyError:
                    pass
                try:
                    await self.session.run()
                except Exception:
                    pass

            async def no_nursery(self):
                try:
                    await self.other()
                except KeyError:
                    pass

            async def other(self):
                pass
        """,
    )
    findings = program_of(tmp_path, ["nsqpy"]).findings()
    assert sorted(finding.function for finding in findings) == [
        "Node.through_a_module",
        "Node.through_an_attribute",
    ]
