"""`python -m supervisor` is `launch`."""

from supervisor.cli import main

main()
