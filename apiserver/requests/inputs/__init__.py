"""Turning request bodies into what the engine runs: items, token rows, pairs, images, engine jobs."""
