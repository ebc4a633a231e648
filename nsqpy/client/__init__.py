"""nsqpy's clients for Python programs (docs/client.md)."""
