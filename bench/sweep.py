"""The scaling sweep: every workload x API-server count x preprocessing mode x concurrency, plus the
generator's ceiling, the offline ceiling, start-up time, memory, and Infinity on the same loads.

    python -m bench.sweep                                  # everything, defaults (make bench)
    python -m bench.sweep --workloads a --concurrency 1,8 --duration 2 --warmup 0.5 --label smoke

Each server is started with `launch --port 0` (its ready line gives the port) and stopped by its
PID at the end, whatever happens; each load runs in its own `python -m bench.loadgen` process.
Writes bench/results/<timestamp>[-label].json (machine, versions, commit, command, every figure),
a .png (throughput and p99 against concurrency, one line per configuration) and a .md table.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.cache_repeat import measure_cache
from bench.harness.machine import REPO, command_line, git_facts, load_average, machine_facts, versions
from bench.harness.models import bundled_model_folder, model_folder
from bench.harness.server_process import (
    ServerProcess,
    StartError,
    memory_mb,
    poolserve_memory,
    process_tree,
    start_infinity,
    start_poolserve,
)
from bench.harness.workloads import MODELS, resolve_name
from bench.priority_mix import measure_priority_mix

RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs" / "benchmarks.md"
BUNDLED_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# Workloads Infinity can serve from the same folder (its CLIP path needs torchvision, which has no
# CPU build here, and the tiny models are poolserve's test fixtures, not a peer's use case).
PEER_WORKLOADS = ("short", "batch16")


def parse_ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


class Sweep:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.started = time.monotonic()
        self.deadline: float = self.started + float(args.max_minutes) * 60
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.stem = RESULTS / (f"{stamp}-{args.label}" if args.label else stamp)
        self.results: dict[str, Any] = {
            "meta": {
                "label": args.label,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": command_line(),
                "git": git_facts(),
                "machine": machine_facts(),
                "versions": versions(),
                "settings": vars(args),
            },
            "ceiling": [],
            "offline": {},
            "runs": [],
            "memory": [],
            "startup": {},
            "peers": {},
            "skipped": [],
        }

    # ---- bookkeeping
    @property
    def is_over_budget(self) -> bool:
        return time.monotonic() > self.deadline

    def skip(self, what: str, why: str) -> None:
        print(f"skipped {what}: {why}", file=sys.stderr)
        self.results["skipped"].append({"what": what, "why": why})

    def save(self) -> Path:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = self.stem.with_suffix(".json")
        path.write_text(json.dumps(self.results, indent=1) + "\n")
        return path

    def log(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[{elapsed:6.0f}s] {text}", file=sys.stderr, flush=True)

    # ---- steps
    def loadgen(self, url: str, workload: str, concurrency: int, *extra: str) -> dict[str, Any]:
        args = self.args
        with tempfile.NamedTemporaryFile(prefix="bench-loadgen-", suffix=".json") as out:
            command = [
                sys.executable,
                "-m",
                "bench.loadgen",
                "--url",
                url,
                "--workload",
                workload,
                "--concurrency",
                str(concurrency),
                "--duration",
                str(args.duration),
                "--warmup",
                str(args.warmup),
                "--client",
                args.client,
                "--seed",
                str(args.seed),
                "--out",
                out.name,
                *extra,
            ]
            timeout = args.warmup + args.duration + 120
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"loadgen failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
            result: dict[str, Any] = json.loads(Path(out.name).read_text())
            return result

    def measure_ceiling(self) -> None:
        """The generator against the trivial server: per workload at the highest concurrency (replies
        as large as the real ones), and every client kind on the bare endpoint."""
        top = max(parse_ints(self.args.concurrency))
        cases = [(workload, self.args.client) for workload in self.workloads()]
        cases += [("trivial", client) for client in self.args.ceiling_clients.split(",") if client]
        for workload, client in cases:
            command = [
                sys.executable,
                "-m",
                "bench.loadgen",
                "--target",
                "trivial",
                "--workload",
                workload,
                "--concurrency",
                str(top),
                "--duration",
                str(min(self.args.duration, 5.0)),
                "--warmup",
                "0.5",
                "--client",
                client,
                "--prober-interval",
                "0",
            ]
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
            if done.returncode != 0:
                self.skip(f"ceiling {workload}/{client}", done.stderr.strip()[-500:])
                continue
            result = json.loads(done.stdout)
            self.results["ceiling"].append(result)
            self.log(
                f"ceiling {workload:8s} {client:7s} c={top}: {result['requests_per_s']:.0f} req/s, "
                f"generator CPU {result['generator']['cpu_share']:.2f}"
            )

    def measure_offline(self) -> None:
        done_models: dict[str, str] = {}
        for workload in self.workloads():
            if workload == "batch16" and "short" in done_models:
                continue  # same model, same corpus: the ceiling is (a)'s
            command = [
                sys.executable,
                "-m",
                "bench.offline",
                "--workload",
                workload,
                "--batch-sizes",
                self.args.offline_batch_sizes,
                "--seconds",
                str(self.args.offline_seconds),
                "--seed",
                str(self.args.seed),
                "--threads",
                str(self.args.torch_threads or ""),
            ]
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800, check=False)
            if done.returncode != 0:
                self.skip(f"offline {workload}", done.stderr.strip()[-1000:])
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            self.results["offline"][workload] = result
            done_models[workload] = result["model"]
            best = result["best"]
            self.log(
                f"offline {workload}: best {best['items_per_s']:.1f} items/s at batch {best['batch_size']} "
                f"({best['order']}), single p50 {result['single_latency_ms']['p50']:.2f} ms"
            )
        if "short" in self.results["offline"] and "batch16" in self.workloads():
            self.results["offline"]["batch16"] = {
                **self.results["offline"]["short"],
                "workload": "batch16",
                "letter": "b",
                "shared_with": "short",
            }

    def measure_startup(self) -> None:
        """`launch` to ready line with the bundled model and 2 API servers, a few times."""
        runs: list[dict[str, Any]] = []
        for _ in range(self.args.startup_runs):
            server = start_poolserve(["--api-server-count", "2", *self.args.server_args.split()])
            try:
                runs.append(
                    {
                        "ready_after_s": server.ready_after,
                        "reported_s": server.ready_reported,
                        "memory_idle": poolserve_memory(server.pid),
                    }
                )
            finally:
                server.stop()
        if runs:
            median = statistics.median(run["ready_after_s"] for run in runs)
            self.results["startup"] = {"api_servers": 2, "model": "bundled", "runs": runs, "median_s": median}
            self.log(f"start-up (bundled, 2 API servers): median {median:.2f}s over {len(runs)} runs")

    @contextmanager
    def poolserve(
        self, workload: str, api_servers: int, preprocess: int, accept_balance: str = ""
    ) -> Iterator[ServerProcess]:
        kind = MODELS[workload]
        args = ["--api-server-count", str(api_servers), "--preprocess-workers", str(preprocess)]
        if accept_balance:
            args += ["--accept-balance", accept_balance]
        if kind != "bundled":
            args += ["--model", str(model_folder(kind))]
        server = start_poolserve([*args, *self.server_args()])
        try:
            yield server
        finally:
            server.stop()

    def run_config(self, workload: str, api_servers: int, preprocess: int, accept_balance: str = "") -> None:
        label = f"{api_servers} API, {'inline' if preprocess == 0 else f'{preprocess} thread'}"
        if accept_balance:
            label += f", accept {accept_balance}"
        with self.poolserve(workload, api_servers, preprocess, accept_balance) as server:
            self.log(f"{workload}: poolserve {label} ready in {server.ready_after:.1f}s on {server.url}")
            for concurrency in parse_ints(self.args.concurrency):
                if self.is_over_budget:
                    self.skip(f"{workload} {label} c={concurrency}", "over --max-minutes")
                    continue
                result = self.loadgen(server.url, workload, concurrency)
                result.update(
                    target="poolserve",
                    config=label,
                    api_servers=api_servers,
                    preprocess_workers=preprocess,
                    accept_balance=accept_balance or "default",
                )
                self.results["runs"].append(result)
                self.log_run(result)
            self.results["memory"].append(
                {"workload": workload, "config": label, "processes": poolserve_memory(server.pid)}
            )
        self.save()

    def log_run(self, result: dict[str, Any]) -> None:
        latency = result["latency_ms"]
        health = result.get("prober", {}).get("latency_ms", {}).get("p99", float("nan"))
        self.log(
            f"  {result['workload']:8s} {result['config']:18s} c={result['concurrency']:<4d} "
            f"{result['requests_per_s']:8.1f} req/s {result['items_per_s']:8.1f} items/s "
            f"p50 {latency['p50']:7.1f} p99 {latency['p99']:7.1f} ms  health p99 {health:.1f} ms"
            f"  errors {result['errors'] or '-'}  gen CPU {result['generator']['cpu_share']:.2f}"
        )

    def run_peers(self) -> None:
        infinity = Path(self.args.peers_venv) / "bin" / "infinity_emb"
        workloads = [w for w in self.workloads() if w in PEER_WORKLOADS]
        if "infinity" not in self.args.peers.split(",") or not workloads:
            return
        if not infinity.is_file():
            self.skip("infinity", f"{infinity} not found; run `make bench-peers`")
            return
        peer: dict[str, Any] = {"version": peer_version(Path(self.args.peers_venv)), "runs": []}
        self.results["peers"]["infinity"] = peer
        try:
            server = start_infinity(
                infinity, bundled_model_folder(), BUNDLED_NAME, batch_size=self.args.peer_batch,
                dtype=self.args.peer_dtype,
            )  # fmt: skip
        except StartError as exc:
            peer["error"] = str(exc)
            self.skip("infinity", str(exc).splitlines()[0])
            return
        try:
            self.log(f"infinity {peer['version'].get('infinity-emb')} ready in {server.ready_after:.1f}s")
            for workload in workloads:
                for concurrency in parse_ints(self.args.concurrency):
                    if self.is_over_budget:
                        self.skip(f"infinity {workload} c={concurrency}", "over --max-minutes")
                        continue
                    result = self.loadgen(
                        server.url, workload, concurrency, "--path", "/embeddings", "--model-name", BUNDLED_NAME
                    )
                    config = f"infinity (batch {self.args.peer_batch}, {self.args.peer_dtype})"
                    result.update(target="infinity", config=config)
                    peer["runs"].append(result)
                    self.results["runs"].append(result)
                    self.log_run(result)
            peer["memory"] = [{"pid": pid, **memory_mb(pid)} for pid in process_tree(server.pid)]
        finally:
            server.stop()
        self.save()

    def run_priority(self) -> None:
        """Queries during bulk indexing (bench/priority_mix.py): p99 unloaded, under bulk at priority 0 and -1."""
        if self.is_over_budget:
            self.skip("priority", "over --max-minutes")
            return
        self.log("priority: queries during bulk load")
        self.results["priority"] = measure_priority_mix(
            bulk_clients=4, bulk_inputs=64, queries=self.args.priority_queries, gap=0.1, api_servers=2,
            server_args=self.server_args(),
        )  # fmt: skip
        self.save()

    def run_cache(self) -> None:
        """A repeated corpus and a distinct one, with the cache off and on (bench/cache_repeat.py)."""
        if self.is_over_budget:
            self.skip("cache", "over --max-minutes")
            return
        self.log("cache: repeated and distinct corpus, cache off and on")
        self.results["cache"] = {
            "sentences": self.args.cache_sentences,
            "repeats": self.args.cache_repeats,
            "runs": measure_cache(
                sentences=self.args.cache_sentences, repeats=self.args.cache_repeats, clients=8, per_request=4,
                cache_bytes=64 * 1024 * 1024, server_args=self.server_args(),
            ),
        }  # fmt: skip
        self.save()

    def server_args(self) -> list[str]:
        threads = ["--torch-threads", str(self.args.torch_threads)] if self.args.torch_threads else []
        return [*threads, *self.args.server_args.split()]

    def workloads(self) -> list[str]:
        return [resolve_name(name) for name in self.args.workloads.split(",") if name]

    def run(self) -> Path:
        steps = set(self.args.steps.split(","))
        if "ceiling" in steps:
            self.measure_ceiling()
        if "offline" in steps:
            self.measure_offline()
        self.save()
        if "startup" in steps:
            self.measure_startup()
        if "serve" in steps:
            for workload in self.workloads():
                for api_servers in parse_ints(self.args.api_servers):
                    for preprocess in parse_ints(self.args.preprocess_workers):
                        for balance in self.args.accept_balance.split(",") if self.args.accept_balance else [""]:
                            what = f"{workload} {api_servers} API / {preprocess}" + (f" / {balance}" if balance else "")
                            if self.is_over_budget:
                                self.skip(what, "over --max-minutes")
                                continue
                            try:
                                self.run_config(workload, api_servers, preprocess, balance)
                            except (StartError, RuntimeError, subprocess.TimeoutExpired) as exc:
                                self.skip(what, str(exc)[:2000])
        if "priority" in steps:
            self.run_priority()
        if "cache" in steps:
            self.run_cache()
        if "peers" in steps:
            self.run_peers()
        self.results["meta"]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.results["meta"]["elapsed_s"] = time.monotonic() - self.started
        self.results["meta"]["machine"]["load_average_at_end"] = load_average()
        return self.save()


def peer_version(venv: Path) -> dict[str, str]:
    script = (
        "import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
        "('infinity-emb', 'torch', 'transformers', 'sentence-transformers')}))"
    )
    try:
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=60, check=False
        )
        found: dict[str, str] = json.loads(done.stdout)
        return found
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--workloads", default="a,b,c,d", help="Comma-separated: a,b,c,d (or their names).")
    parser.add_argument("--api-servers", default="1,2", help="--api-server-count values.")
    parser.add_argument("--preprocess-workers", default="0,1", help="--preprocess-workers values (0: inline).")
    parser.add_argument("--concurrency", default="1,8,32,64", help="Closed-loop client counts.")
    parser.add_argument("--duration", type=float, default=10.0, help="Measured seconds per run.")
    parser.add_argument("--warmup", type=float, default=2.0, help="Unmeasured seconds before each run.")
    parser.add_argument("--client", default="raw", help="Load generator client (raw, httpx, aiohttp).")
    parser.add_argument("--ceiling-clients", default="raw,aiohttp,httpx", help="Clients compared on the ceiling.")
    parser.add_argument("--offline-batch-sizes", default="1,8,16,32,64,128")
    parser.add_argument("--offline-seconds", type=float, default=2.0, help="Per batch size, order and thread count.")
    parser.add_argument("--startup-runs", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=0, help="Passed to the server and the offline run.")
    parser.add_argument(
        "--accept-balance",
        default="",
        help="--accept-balance values to compare, e.g. both,none (fair accept on and off); empty: the default only.",
    )
    parser.add_argument("--server-args", default="", help="Extra `launch` flags for every poolserve run.")
    parser.add_argument("--peers", default="infinity", help="Peers to run on (a) and (b): infinity, or none.")
    parser.add_argument("--peers-venv", default=str(REPO / "bench" / ".peers-venv"))
    parser.add_argument("--peer-batch", type=int, default=32, help="Infinity's --batch-size.")
    parser.add_argument(
        "--peer-dtype", default="float32", help="Infinity's --dtype: compare at the precision poolserve serves here."
    )
    parser.add_argument(
        "--steps", default="ceiling,offline,startup,serve,priority,cache,peers", help="Which steps to run."
    )
    parser.add_argument("--priority-queries", type=int, default=40, help="Queries per priority under bulk load.")
    parser.add_argument("--cache-sentences", type=int, default=300, help="Distinct sentences of the repeated corpus.")
    parser.add_argument("--cache-repeats", type=int, default=10, help="Times each is sent, in a shuffled order.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-minutes", type=float, default=45.0, help="Runs left past this are skipped (noted).")
    parser.add_argument("--label", default="", help="Appended to the result files' names; shown in the table.")
    parser.add_argument("--update-docs", action="store_true", help="Put the table into docs/benchmarks.md.")
    return parser


def handle_term(signum: int, frame: object) -> None:
    # Unwinds through every `finally`, so each server started is stopped by its PID.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, handle_term)
    sweep = Sweep(args)
    sweep.log(
        f"sweep: {args.workloads} x servers {args.api_servers} x preprocess {args.preprocess_workers} "
        f"x concurrency {args.concurrency}, {args.duration}s each; results in {sweep.stem}.*"
    )
    path = sweep.run()
    from bench.report import write_report

    markdown = write_report(sweep.results, sweep.stem, update_docs=DOCS if args.update_docs else None)
    print(markdown)
    print(f"results: {path} (+ .md, .png)", file=sys.stderr)


if __name__ == "__main__":
    main()
