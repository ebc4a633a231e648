"""The NSQ utilities and the local cluster runner behind `make run`."""
