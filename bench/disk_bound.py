"""Diskqueue-bound TCP publish and consume: bench.pub_sub with ``--mem-queue-size=0``.

    .venv/bin/python -m bench.disk_bound [pub_sub's options, e.g. --quick --consumers 1,4]

With a memory queue of 0 every published message is written to a diskqueue (the topic's
when it has no channel, else the channel's) and every delivered one is read back from it and
decoded. Defaults: publish with 1 connection (topic without channel), publish with 4
connections into a channel (the fill), consume with 1 connection; 1,000,000 messages of 200
bytes, median (min–max) of 3 runs, fresh nsqd per run.
"""

import sys

from bench import pub_sub


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    defaults = ["--mem-queue-size=0", "--publishers=1", "--consumers=1", "--no-targets"]
    pub_sub.main([*defaults, "--name=diskqueue_bound", *argv])


if __name__ == "__main__":
    main()
