"""poolserve's bench suite: load generator, offline ceiling, scaling sweep, peer comparison, plots."""
