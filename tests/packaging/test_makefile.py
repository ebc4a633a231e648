"""The README's two commands: `make run` needs Python alone, `make test` installs the test tools.

Each test dry-runs make (`make -n`) in a folder holding only the Makefile and pyproject.toml,
as a fresh clone with no virtualenv yet, and reads the commands make would run.
"""

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _dry_run(target: str, folder: Path) -> str:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(REPO / name, folder / name)
    node_dir = folder / "tests" / "interop" / "node"
    node_dir.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy2(REPO / "tests" / "interop" / "node" / name, node_dir / name)
    # Run as from a shell, not as a sub-make of `make test`, which would print its directory.
    environment = {
        k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")
    }
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", target],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_run_installs_the_package_alone_and_starts_the_cluster(tmp_path: Path) -> None:
    commands = _dry_run("run", tmp_path)
    assert "pip install --quiet -e .\n" in commands
    assert "python -m nsqpy.tools.local_cluster" in commands
    for test_tool in ("npm", "[test", "spark", "apt-get", "chromium", "java", "pytest"):
        assert test_tool not in commands


def test_make_test_installs_every_test_tool_then_runs_the_suite(tmp_path: Path) -> None:
    commands = _dry_run("test", tmp_path)
    for step in (
        "pip install --quiet --no-compile -e '.[test,spark]'",
        # pip compiled nothing: the bytecode of site-packages too is written before the suite.
        '-x "/site-packages/.*/tests/"',
        "npm ci --prefix tests/interop/node",
        'pip download --quiet --no-deps --no-binary :all: "gnsq==$version"',
        "chromium chromium-driver",
        "openjdk-17-jre-headless",
        "nodejs npm",
        "ruff check .",
        "python -m pytest",
    ):
        assert step in commands
    assert commands.index("ruff check .") < commands.index("python -m pytest")
    assert commands.index('-x "/site-packages/') < commands.index("python -m pytest")


def test_make_install_prints_no_setuptools_warnings(tmp_path: Path) -> None:
    """The first thing `make run` does: install the package into a new virtualenv, quietly
    (setuptools' notices and deprecations are for the project, not for its users)."""
    environment = {
        k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")
    }
    result = subprocess.run(
        ["make", "--no-print-directory", "install", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout + result.stderr
    for marker in ("BuildBackendWarning", "SetuptoolsDeprecationWarning", "!!"):
        assert marker not in output, output
    assert (tmp_path / "venv" / "bin" / "nsqd").exists()
