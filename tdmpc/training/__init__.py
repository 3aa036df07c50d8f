"""Training runs: the one setup pipeline, the loop (online and offline), run directories, logs, --init-from."""
