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
                names = [node.module]
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
