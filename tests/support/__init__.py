"""What the tests share: polling for conditions, HTTP to the daemons, starting them."""
