"""A stand-in for the engine template (engine_core/template.py), without torch: it reads its TemplateSpec and speaks
the real boot pipe and fork socket, and does what its one argument says:

    fail      report a failed boot (as a template that could not import does), and exit 3
    refuse    report ready, then answer every fork request with an error (a fork that failed)
    vanish    report ready, then exit (a template that died)
"""

from __future__ import annotations

import os
import socket
import sys

import msgspec

from poolserve.boot import EXIT_BOOT_ERROR, BootReport, write_boot_report
from poolserve.engine_template import MAX_REQUEST_BYTES, ForkReply, read_template_spec


def main() -> int:
    mode = sys.argv[1]
    spec = read_template_spec()
    if mode == "fail":
        write_boot_report(spec.boot_fd, BootReport(status="failed", message="stub cannot import"))
        return EXIT_BOOT_ERROR
    write_boot_report(spec.boot_fd, BootReport(status="ready", message="stub"))
    if mode == "vanish":
        return 0
    control = socket.socket(fileno=spec.control_fd)
    while True:
        message, fds, _, _ = socket.recv_fds(control, MAX_REQUEST_BYTES, 1)
        if not message:
            return 0
        for fd in fds:
            os.close(fd)
        control.send(msgspec.json.encode(ForkReply(error="stub refuses")))


if __name__ == "__main__":
    sys.exit(main())
