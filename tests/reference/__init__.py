"""Where the captured Go NSQ v1.3.0 responses live: `tests/reference/go-1.3.0/`, with their
`INDEX.txt` (request of each capture, the ports and names used while recording)."""

from pathlib import Path

REFERENCE_DIR = Path(__file__).resolve().parent / "go-1.3.0"
