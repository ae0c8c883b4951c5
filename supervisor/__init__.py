"""The supervisor process: the `launch` CLI, process lifecycle and signals."""
