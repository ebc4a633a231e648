"""Run every benchmark module in bench/, one after another, each in its own interpreter.

    .venv/bin/python -m bench                  # all of them
    .venv/bin/python -m bench pub_sub          # only the named ones

A benchmark is any module of this package whose name does not start with an underscore; it
runs as `python -m bench.<name>` with its default options.
"""

import pkgutil
import subprocess
import sys
import time
from pathlib import Path

import bench


def discover() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.iter_modules(bench.__path__)
        if not info.name.startswith("_") and not info.ispkg
    )


def main(argv: list[str] | None = None) -> int:
    names = discover()
    wanted = sys.argv[1:] if argv is None else argv
    unknown = [name for name in wanted if name not in names]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(names)}")
        return 2
    failed = []
    root = Path(bench.__file__).resolve().parent.parent
    for name in wanted or names:
        print(f"== bench.{name}", flush=True)
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", f"bench.{name}"], cwd=root)
        print(f"== bench.{name}: exit {result.returncode}, {time.monotonic() - started:.0f} s\n")
        if result.returncode:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
