"""What every daemon runs on: the console script's command line and trio run, Go-format
logging, listening addresses, the HTTP server and its poller, and embedding a daemon in a
program."""
