"""API-server process: HTTP in, tokenized requests to the engine, pooled vectors out. Never imports torch."""
