"""SIGTERM under keep-alive load, many times: how long each stop takes, and what the clients saw.

Each round starts `launch` (two API servers, the bundled model), runs `--keep-alive` clients on one
connection each and `--reconnecting` clients that open a connection per request, all sending
single-sentence `/v1/embeddings` back to back, then sends SIGTERM and times the exit. A client whose
connection is closed after an answer reconnects (a closed keep-alive connection is what a drain is); what
counts is an answer other than 200, a reset in the middle of a request, the exit code, and the time.

    python -m bench.stop_under_load --rounds 12
    git worktree add /tmp/before <commit> && python -m bench.stop_under_load --checkout /tmp/before
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.server_process import REPO, PoolserveProcess

BODY = json.dumps({"input": "a sentence to embed while the server stops"}).encode()


@dataclass
class Client:
    url_host: str
    port: int
    keep_alive: bool
    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    closed_by_server: int = 0

    def run(self, stop: threading.Event) -> None:
        connection: http.client.HTTPConnection | None = None
        while not stop.is_set():
            if connection is None:
                connection = http.client.HTTPConnection(self.url_host, self.port, timeout=60)
            try:
                connection.request("POST", "/v1/embeddings", BODY, {"content-type": "application/json"})
                response = connection.getresponse()
                response.read()
            except (ConnectionRefusedError, http.client.RemoteDisconnected, OSError) as exc:
                # Refused: the server has stopped listening, which ends this client's part.
                if isinstance(exc, ConnectionRefusedError):
                    return
                self.errors.append(type(exc).__name__)
                connection.close()
                connection = None
                continue
            self.statuses[response.status] = self.statuses.get(response.status, 0) + 1
            if response.getheader("connection", "").lower() == "close" or not self.keep_alive:
                self.closed_by_server += response.getheader("connection", "").lower() == "close"
                connection.close()
                connection = None
        if connection is not None:
            connection.close()


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def one_stop(keep_alive: int, reconnecting: int, load_seconds: float, checkout: Path) -> dict[str, object]:
    server = PoolserveProcess("--api-server-count", "2", "--dtype", "float32", cwd=checkout)
    try:
        server.wait_ready(300)
    except BaseException:
        server.stop()
        raise
    host, port = server.url.removeprefix("http://").split(":")
    clients = [Client(host, int(port), keep_alive=i < keep_alive) for i in range(keep_alive + reconnecting)]
    stop = threading.Event()
    threads = [threading.Thread(target=client.run, args=(stop,)) for client in clients]
    try:
        for thread in threads:
            thread.start()
        time.sleep(load_seconds)
        children = server.children()
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(120)
        seconds = time.monotonic() - started
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        time.sleep(1)
        left = [pid for pid in children if is_alive(pid)]
        server.stop()
    statuses: dict[int, int] = {}
    for client in clients:
        for status, count in client.statuses.items():
            statuses[status] = statuses.get(status, 0) + count
    return {
        "seconds": round(seconds, 2),
        "exit": code,
        "statuses": statuses,
        "errors": sorted(error for client in clients for error in client.errors),
        "closed_by_server": sum(client.closed_by_server for client in clients if client.keep_alive),
        "processes_left": len(left),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--keep-alive", type=int, default=4)
    parser.add_argument("--reconnecting", type=int, default=2)
    parser.add_argument("--load-seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--checkout", type=Path, default=REPO, help="the checkout whose server runs (a worktree of another commit)"
    )
    args = parser.parse_args()
    results = []
    for number in range(args.rounds):
        result = one_stop(args.keep_alive, args.reconnecting, args.load_seconds, args.checkout)
        results.append(result)
        print(f"stop {number + 1}: {json.dumps(result)}", flush=True)
    times = sorted(float(result["seconds"]) for result in results)  # type: ignore[arg-type]
    print(f"stops: {len(times)}, seconds min {times[0]:.2f} median {times[len(times) // 2]:.2f} max {times[-1]:.2f}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
