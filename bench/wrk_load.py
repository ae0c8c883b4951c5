"""A closed-loop load of one bench workload driven by Debian's `wrk`, a native generator.

bench.loadgen costs ~150 µs of Python per request itself; on a 2-core host that competes with the server it
measures. `wrk` sends the same bodies (bench.harness.workloads, cycled in order) from C at a few µs a request. It
prints one JSON line, the fields bench.request_cpu reads from bench.loadgen:

    python -m bench.wrk_load --url http://127.0.0.1:8000 --workload short --concurrency 64 --duration 10

Warm-up is a first wrk run whose figures are dropped (wrk has no warm-up of its own).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.harness.workloads import Workload, build_workload

# wrk's Lua: cycle through the bodies (one request each), count non-2xx answers, print a JSON summary.
SCRIPT = """
local bodies = {%(bodies)s}
local n = #bodies
local i = 0
local path = %(path)s
local headers = {["Content-Type"] = "application/json"}
request = function()
  i = i %% n + 1
  return wrk.format("%(method)s", path, headers, bodies[i])
end
local failed = 0
response = function(status, headers, body)
  if status >= 300 then failed = failed + 1 end
end
done = function(summary, latency, requests)
  local errors = summary.errors
  local socket = errors.connect + errors.read + errors.write + errors.timeout
  io.write(string.format(
    '{"requests": %%d, "seconds": %%.6f, "non_2xx": %%d, "socket_errors": %%d, '
    .. '"p50_us": %%d, "p99_us": %%d, "max_us": %%d}\\n',
    summary.requests, summary.duration / 1e6, errors.status, socket,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def lua_string(data: bytes) -> str:
    """A Lua string literal holding `data` exactly: quotes, backslashes and bytes outside printable ASCII escaped as
    three decimal digits (Lua reads up to three, so a shorter escape before a digit would take the digit in)."""
    escaped = (f"\\{byte:03d}" if byte < 32 or byte in b'"\\' or byte > 126 else chr(byte) for byte in data)
    return '"' + "".join(escaped) + '"'


def write_script(workload: Workload, folder: Path) -> Path:
    script = folder / f"{workload.name}.lua"
    bodies = ",\n".join(lua_string(body) for body in workload.bodies)
    script.write_text(
        SCRIPT % {"bodies": bodies, "path": lua_string(workload.path.encode()), "method": workload.method}
    )
    return script


def run_wrk(url: str, script: Path, *, concurrency: int, seconds: float, path: str) -> dict[str, float]:
    argv = ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout", "30s",
            "-s", str(script), f"{url}{path}"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    summary: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--workload", default="short")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--model-name", default="")
    parser.add_argument("--path", default="", help="the route, where not the workload's own (a peer's /embeddings)")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk); or use bench.loadgen")
    workload = build_workload(args.workload, model_name=args.model_name)
    if args.path:
        workload = dataclasses.replace(workload, path=args.path)
    with tempfile.TemporaryDirectory() as folder:
        script = write_script(workload, Path(folder))
        if args.warmup > 0:
            run_wrk(args.url, script, concurrency=args.concurrency, seconds=args.warmup, path=workload.path)
        summary = run_wrk(args.url, script, concurrency=args.concurrency, seconds=args.duration, path=workload.path)
    requests, seconds = summary["requests"], summary["seconds"]
    result = {
        "workload": workload.name,
        "requests": requests,
        "requests_per_s": requests / seconds if seconds else 0.0,
        # bench.loadgen's shape: a count by kind, empty when every request was answered 2xx.
        "errors": {kind: n for kind, n in (("non_2xx", summary["non_2xx"]), ("socket", summary["socket_errors"])) if n},
        "latency_ms": {"p50": summary["p50_us"] / 1000, "p99": summary["p99_us"] / 1000},
        "generator": {"cpu_share": 0.0},
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
