"""The top-level folders are packages of `nsqpy` by pyproject.toml's package-dir mapping, not by
links: modules name the files where they are, the tree holds no symbolic link, and a folder
imported by its bare name from the repository's root is refused (docs/design.md §1)."""

import subprocess
import sys
import tomllib
from pathlib import Path

import nsqpy.nsqd.server

REPO = Path(__file__).resolve().parents[2]


def mapped_folders() -> dict[str, str]:
    with open(REPO / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["tool"]["setuptools"]["package-dir"]


def test_every_top_level_package_is_mapped_into_nsqpy():
    packages = {path.parent.name for path in REPO.glob("*/__init__.py")}
    # Not part of the distribution: the test suite, benchmarks, fuzz targets and examples,
    # and `nsqpy` itself.
    packages -= {"tests", "bench", "fuzz", "examples", "nsqpy"}
    assert mapped_folders() == {f"nsqpy.{name}": name for name in sorted(packages)}


def test_the_tree_holds_no_symbolic_link():
    listed = subprocess.run(
        ["git", "ls-files", "--stage"], cwd=REPO, capture_output=True, text=True, check=True
    )
    # Mode 120000: a symbolic link.
    links = [line for line in listed.stdout.splitlines() if line.startswith("120000 ")]
    assert links == []


def test_a_module_names_the_file_where_it_is():
    # A traceback, an editor and `git blame` take this path as it is.
    assert Path(nsqpy.nsqd.server.__file__) == REPO / "nsqd" / "server.py"


def test_a_folder_imported_by_its_bare_name_from_the_root_is_refused():
    names = sorted(mapped_folders().values())
    script = (
        "import sys\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        __import__(name + '.duration' if name == 'common' else name)\n"
        "    except ImportError as error:\n"
        "        print(name, error)\n"
        "    else:\n"
        "        print(name, 'imported')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert run.stdout.splitlines() == [
        f"{name} import nsqpy.{name}, not {name}: the folder {name}/ is the package nsqpy.{name}"
        for name in names
    ]
