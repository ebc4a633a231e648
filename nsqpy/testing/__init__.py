"""pytest fixtures that run a real nsqd and nsqlookupd in the test process (see plugin)."""
