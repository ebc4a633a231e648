"""mypy over the `nsqpy` package as it installs: `make lint` runs it.

`nsqpy.nsqd`, `nsqpy.common` and the other mapped packages live in top-level folders
(`[tool.setuptools.package-dir]` in pyproject.toml), a mapping that setuptools applies when it
builds a wheel and through an import hook in an editable install. mypy finds modules by their
place on disk and runs no import hook, so this hands it every file under the module name it
installs as; errors name the real files. The options are `[tool.mypy]`'s.

    .venv/bin/python scripts/typecheck.py
"""

import sys
import tomllib
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.fscache import FileSystemCache
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent


def package_dirs() -> dict[str, Path]:
    """Each package pyproject.toml maps to a folder of its own: import name -> folder."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        mapping = tomllib.load(file)["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in mapping.items()}


def module_sources(package: str, folder: Path) -> list[BuildSource]:
    """Every module in `folder` and the packages below it, named as `package`'s."""
    sources = []
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        if not all(
            (folder.joinpath(*parts[:depth]) / "__init__.py").exists()
            for depth in range(len(parts))
        ):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        sources.append(BuildSource(str(path.relative_to(ROOT)), ".".join((package, *parts))))
    return sources


def main() -> int:
    fscache = FileSystemCache()
    sources, options = process_options(
        ["--config-file", str(ROOT / "pyproject.toml"), "nsqpy"], fscache=fscache
    )
    for package, folder in package_dirs().items():
        sources += module_sources(package, folder)
    try:
        result = build.build(sources, options, fscache=fscache)
        messages = result.errors
    except CompileError as error:
        messages = error.messages
    for line in messages:
        print(line)
    files = len(sources)
    if any(": error:" in line for line in messages):
        print(f"Found errors in {files} source files")
        return 1
    print(f"Success: no issues found in {files} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
