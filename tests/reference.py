"""Where the captured Go NSQ v1.3.0 responses live: `shared/` beside the checkout."""

from pathlib import Path

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "shared" / "reference" / "go-nsq-1.3.0"
