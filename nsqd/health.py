"""nsqd's health, as `/ping` and `/stats` report it: OK, or `NOK - <why>` while the disk refuses.

Go's SetHealth is called after every diskqueue write; here a failed fsync or metadata write
counts too, until the next one succeeds.
"""

import logging
from collections.abc import Callable


class Health:
    """OK unless the last write, or the last sync, failed."""

    def __init__(self, log: logging.Logger | logging.LoggerAdapter) -> None:
        self.log = log
        self.text = "OK"
        self._write_error: str | None = None
        self._sync_error: str | None = None
        # Told each new text (a worker tells the others through its supervisor).
        self.on_change: Callable[[str], None] | None = None

    @property
    def ok(self) -> bool:
        return self.text == "OK"

    def write_done(self, error: Exception | str | None) -> None:
        """After every write: NOK with a failed one's error until a later write succeeds."""
        if error is None and self._write_error is None:
            return
        self._write_error = None if error is None else str(error)
        self._update()

    def sync_done(self, error: str | None) -> None:
        """After an fsync or a metadata write: NOK with why it failed until one succeeds."""
        if error == self._sync_error:
            return
        self._sync_error = error
        self._update()

    def _update(self) -> None:
        error = self._write_error or self._sync_error
        text = "OK" if error is None else f"NOK - {error}"
        if text == self.text:
            return
        if error is None:
            self.log.info("NSQ: health OK again, the disk accepts writes")
        else:
            self.log.error("NSQ: health %s", text)
        self.text = text
        if self.on_change is not None:
            self.on_change(text)
