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


def test_another_tree_first_on_the_path_runs_its_own_folders(tmp_path):
    """A worktree or an archive put first on `PYTHONPATH` (as the benchmarks run the tree they
    compare with) imports its own `nsqpy.nsqd`, not the editable install's."""
    other = tmp_path / "tree"
    other.mkdir()
    (other / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    for folder in ("nsqpy", *mapped_folders().values()):
        subprocess.run(["cp", "-r", str(REPO / folder), str(other / folder)], check=True)
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "import nsqpy.nsqd.server as s, nsqpy.common as c; print(s.__file__, c.__file__)",
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(other), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.split() == [
        str(other / "nsqd" / "server.py"),
        str(other / "common" / "__init__.py"),
    ]
