"""`launch run-batch`: offline jobs over a file, through the same server `launch` starts."""
