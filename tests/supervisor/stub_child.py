"""A stand-in for an engine or an API server, started by the supervisor's real spawning code: it reads its spec as
they do, speaks the real boot pipe (poolserve/boot.py) and then does what its orders say, without importing torch.

Usage (the command the tests give the supervisor for a role): `python stub_child.py ORDERS_FOLDER`. The file
ORDERS_FOLDER/<child name> holds one line per start of that child (the last line serves every later start; no file:
`ready`); a line is steps run in turn, after which the child serves until SIGTERM:

    ready            report ready on the boot pipe (heartbeats, every 0.2 s, start with the process)
    fail MESSAGE...  report a failed boot with the rest of the line as its message, and exit 3
    sleep SECONDS    wait, beating
    exit CODE        exit with this code
    kill             SIGKILL itself (a crash)
    hang             stop beating and wait forever (a blocked event loop)

An API server also accepts on the shared socket and answers any request `200 <name> <pid>`. Every child appends
`<name> <pid> <event> <monotonic time>` lines (start, ready, kill, term) to ORDERS_FOLDER/events.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from poolserve.boot import EXIT_BOOT_ERROR, BootReport, exit_with_parent, read_child_spec, report_boot, send_heartbeat

HEARTBEAT_S = 0.2


def main() -> None:
    orders = Path(sys.argv[1])
    spec = read_child_spec()
    exit_with_parent(spec.supervisor_pid)
    name, pid = spec.name, os.getpid()
    events = os.open(orders / "events", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def note(event: str) -> None:
        os.write(events, f"{name} {pid} {event} {time.monotonic()}\n".encode())

    started = (orders / "events").read_text().split("\n")
    generation = sum(1 for line in started if line.split()[:1] == [name] and line.split()[2] == "start")
    note("start")
    lines = (orders / name).read_text().splitlines() if (orders / name).exists() else ["ready"]
    steps = lines[min(generation, len(lines) - 1)].split()

    beating = threading.Event()

    def beat() -> None:
        while True:
            beating.wait()
            send_heartbeat(spec)
            time.sleep(HEARTBEAT_S)

    def handle_term(signum: int, frame: object) -> None:
        note("term")
        os._exit(0)

    signal.signal(signal.SIGTERM, handle_term)
    threading.Thread(target=beat, daemon=True).start()
    while steps:
        step, *rest = steps
        steps = rest
        if step == "ready":
            note("ready")  # before the supervisor can act on it
            report_boot(spec, BootReport(status="ready", message=f"stub {name}"))
            beating.set()
        elif step == "fail":
            report_boot(spec, BootReport(status="failed", message=" ".join(rest)))
            sys.exit(EXIT_BOOT_ERROR)
        elif step == "sleep":
            time.sleep(float(steps.pop(0)))
        elif step == "exit":
            sys.exit(int(steps.pop(0)))
        elif step == "kill":
            note("kill")
            os.kill(pid, signal.SIGKILL)
        elif step == "hang":
            beating.clear()
            threading.Event().wait()
        else:
            raise SystemExit(f"stub_child: unknown step {step!r}")
    if spec.listen_fd >= 0:
        answer(socket.socket(fileno=spec.listen_fd), f"{name} {pid}".encode())
    threading.Event().wait()


def answer(listener: socket.socket, body: bytes) -> None:
    """Answer every connection on the shared socket, as a server would: a readiness wait on the socket wakes every
    process that waits (uvicorn's event loop), and each tries to accept."""
    listener.setblocking(False)
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        while True:
            selector.select()
            try:
                connection, _ = listener.accept()
            except BlockingIOError:
                continue
            with connection:
                connection.settimeout(5)
                request = b""
                while b"\r\n\r\n" not in request and (chunk := connection.recv(4096)):
                    request += chunk
                connection.sendall(reply)


if __name__ == "__main__":
    main()
