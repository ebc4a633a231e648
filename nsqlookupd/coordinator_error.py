"""The error of a request the master coordinator refuses: the HTTP status and Youzan's text."""


class CoordinatorError(Exception):
    """A request the coordinator refuses: `status` and Youzan-style `text` for HTTP."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
