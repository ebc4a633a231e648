"""Interop tests: real third-party NSQ clients against our nsqd."""
