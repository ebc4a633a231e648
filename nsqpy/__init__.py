"""nsqpy: NSQ, the realtime distributed message queue, in pure Python.

Every import package of the distribution lives under this one name:

* `nsqpy.nsqd`, `nsqpy.nsqlookupd`, `nsqpy.nsqadmin`: the three daemons (`python -m
  nsqpy.nsqd`, or the `nsqd` console script);
* `nsqpy.common`: the wire codecs and pure helpers they share;
* `nsqpy.diskqueue`: Go nsqd's on-disk queue;
* `nsqpy.tools`: the NSQ utilities (`nsq_tail`, `to_nsq`, ...);
* `nsqpy.spark`: the PySpark data source `nsq`;
* `nsqpy.testing`: the pytest plugin whose fixtures run a real nsqd and nsqlookupd.

In the source tree the daemons, `common`, `diskqueue`, `partition_log` and `tools` keep their
top-level folders, which pyproject.toml maps into this package (`[tool.setuptools.package-dir]`):
a wheel holds them under `nsqpy/`, an editable install maps them with setuptools' import hook.
"""

__version__ = "0.1.0"


def refuse_bare_name(name: str) -> None:
    """Called by each mapped folder's `__init__` with its `__name__`: from the repository's
    root a folder also imports by its bare name (`common`), which would load every module a
    second time, with state of its own, as `common.x` beside `nsqpy.common.x`."""
    if not name.startswith("nsqpy."):
        raise ImportError(
            f"import nsqpy.{name}, not {name}: the folder {name}/ is the package nsqpy.{name}"
        )


def _serve_own_folders() -> None:
    """In a source tree, the mapped folders are found beside this package, so that a tree put
    first on `PYTHONPATH` (a worktree or an archive the benchmarks compare with the checkout)
    runs its own daemons: setuptools' import hook maps them to the tree installed in editable
    mode, whichever `nsqpy` was imported. A wheel holds them under `nsqpy/`."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(root, "pyproject.toml")) and os.path.isfile(
        os.path.join(root, "nsqd", "__init__.py")
    ):
        __path__.append(root)


_serve_own_folders()
