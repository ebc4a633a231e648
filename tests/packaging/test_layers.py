"""The packages import each other exactly as docs/design.md §1 says: `common` imports none of
them, the daemons never import each other, the clients need no daemon. A new import across
packages is a design change and goes into the table with it."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "design.md"


def import_name(folder: str) -> str:
    """`nsqd/` → `nsqpy.nsqd`, `nsqpy/client/` → `nsqpy.client`, `nsqpy/etcd.py` → `nsqpy.etcd`."""
    path = folder.strip("/").removesuffix(".py")
    return path.replace("/", ".") if path.startswith("nsqpy/") else f"nsqpy.{path}"


def documented() -> dict[str, set[str]]:
    """The §1 table: each package's folder and the packages its imports column names."""
    table = {}
    for line in DESIGN.read_text().splitlines():
        match = re.match(r"\| `([\w/.]+)` \| .* \| ([^|]*) \|$", line)
        if match:
            names = re.findall(r"`([\w.]+)`", match.group(2))
            table[match.group(1)] = {name if "." in name else f"nsqpy.{name}" for name in names}
    return table


def imported(folder: str, packages: list[str]) -> set[str]:
    """The other packages the modules under `folder` import (type-only imports included)."""
    path = REPO / folder
    own = import_name(folder)
    found = set()
    for module in [path] if path.suffix == ".py" else path.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                # `from nsqpy import network` imports `nsqpy.network`.
                names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                for package in sorted(packages, key=len, reverse=True):
                    if name == package or name.startswith(package + "."):
                        if package != own:
                            found.add(package)
                        break
    return found


def test_the_design_table_lists_every_package():
    table = documented()
    assert {"common/", "nsqd/", "nsqpy/client/", "nsqpy/daemon/", "nsqpy/etcd.py"} <= set(table)


def test_each_package_imports_what_the_design_says():
    table = documented()
    packages = [import_name(folder) for folder in table]
    actual = {folder: imported(folder, packages) for folder in table}
    assert actual == table


def calls_of(folder: str, method: str) -> dict[str, int]:
    """How many calls of `.method(...)` each module under `folder` makes."""
    counts = {}
    for module in sorted((REPO / folder).rglob("*.py")):
        found = sum(
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == method
            for node in ast.walk(ast.parse(module.read_text()))
        )
        if found:
            counts[module.name] = found
    return counts


def test_where_a_topic_is_served_is_asked_only_by_the_tcp_and_http_paths():
    """docs/design.md §12, Placement: the placement is the one place that decides whether a
    topic is served here, by another worker, or refused; nothing else asks a worker for a
    topic's owner or a partition's replica for a publish refusal. The connection paths that
    ask: TCP clients, HTTP, and a cluster peer's replication connection (`peer_server.py`)."""
    assert set(calls_of("nsqd", "worker_for")) == {
        "protocol_v2.py",
        "worker_http.py",
        "peer_server.py",
    }
    assert calls_of("nsqd", "worker_for")["peer_server.py"] == 1
    assert set(calls_of("nsqd", "refuses_to_create")) == {"server.py", "placement.py"}
    refusals = calls_of("nsqd", "refusal")
    assert set(refusals) == {"protocol_v2.py", "http_api.py", "placement.py"}
    assert calls_of("nsqd", "owner") == {"placement.py": 1}
    assert set(calls_of("nsqd", "owns")) == {"placement.py", "server.py", "worker.py"}


def test_every_endpoint_for_all_of_a_topics_partitions_is_known_to_the_worker_router():
    """A topic or channel endpoint that acts on every partition when the request names none
    (`HTTPAPI._partitions`) is in `EVERY_PARTITION_ROUTES`: under `--workers` a topic's
    partitions lie with several workers, and only a listed route is answered by each of them
    (`nsqd/worker_http.py`). `_log_partition` needs a named partition, so its routes go to
    that partition's worker."""
    from nsqpy.nsqd.http_api import EVERY_PARTITION_ROUTES

    tree = ast.parse((REPO / "nsqd" / "http_api.py").read_text())
    (api,) = [
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "HTTPAPI"
    ]
    calls: dict[str, set[str]] = {}
    for method in api.body:
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            calls[method.name] = {
                node.func.attr
                for node in ast.walk(method)
                if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "self"
            }
    every_partition = {"_partitions"}
    while True:
        more = {
            name
            for name, called in calls.items()
            if name != "_log_partition" and called & every_partition
        }
        if more <= every_partition:
            break
        every_partition |= more
    routes = {
        (call.args[0].value, call.args[1].value)
        for call in ast.walk(api)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "add"
        and len(call.args) >= 3
        and isinstance(call.args[2], ast.Attribute)
        and call.args[2].attr in every_partition
    }
    # `/coordinator/stats` reads `partition=` itself (`_any_partition`): every partition of
    # the topic when it names none.
    assert routes | {("GET", "/coordinator/stats")} == EVERY_PARTITION_ROUTES


def test_the_v2_interpreter_does_no_io():
    """docs/design.md §12, Connection and interpreter: the V2 commands' files import nothing
    that reads, writes, waits or reads the clock; `nsqd/connection.py` does all of that for
    them through the effects they yield."""
    io_modules = {"trio", "socket", "ssl", "select", "os", "asyncio", "threading", "time"}
    for name in ("protocol_v2.py", "protocol_youzan.py", "effects.py", "dialect.py"):
        tree = ast.parse((REPO / "nsqd" / name).read_text())
        imported_modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported_modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported_modules.add(node.module.split(".")[0])
        assert not imported_modules & io_modules, name
