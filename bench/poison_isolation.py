"""One model's latency while another model of the same server swallows poison pills (issue 30).

    python -m bench.poison_isolation --rounds 3 --clients 2

One `launch` serves the bundled MiniLM (`minilm`) and the fault tests' tiny BERT whose own code crashes its engine
on a marker token (`faulty`, bench/harness/models.py). Closed-loop clients embed 4 sentences on minilm throughout, while
these phases follow each other, each round in turn:

- quiet: QUIET_S seconds, nothing else;
- pill: faulty gets one poison pill, and the phase lasts until faulty answers again: the pill crashes faulty's
  engine, runs alone on its restart, crashes it again and is failed (500 `poison_pill`), and faulty's second
  restart serves;
- quiet again;
- restarts (the control): faulty's engine killed with SIGKILL, and again once it serves, until it serves: the same
  two restarts with no pill, so what the pill phase costs beyond this phase would be the pill's own.

minilm's latencies are split by the phase they finished in, so every phase is measured in the same run. Each pill or
pair of kills is two crashes, with a quiet phase between: faulty stays within the restart policy's 5 crashes a minute
(supervisor/restart_policy.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx

from bench.harness.models import CRASH_TOKEN, model_folder, remote_code_env
from bench.harness.server_process import PoolserveProcess, wait_until
from bench.harness.stats import summarize_latencies
from bench.harness.steady_load import SteadyLoad

QUIET_S = 25.0
# Sent to the healthy model throughout; a poison pill: the crash token between [CLS] and [SEP].
STEADY_BODY: dict[str, object] = {
    "input": [
        "a steady stream of short sentences",
        "the other model of this server is crashing",
        "these requests should not notice",
        "each one embeds four sentences",
    ],
    "model": "minilm",
}
PILL: dict[str, object] = {"input": [[101, CRASH_TOKEN, 102]], "model": "faulty"}


def send_pill(url: str, timeout: float = 120.0) -> dict[str, Any]:
    """One poison pill to `faulty`, then harmless requests until faulty answers one: the pill's status and error
    code, and the seconds until its answer and until faulty served again."""
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=timeout) as client:
        answer = client.post("/v1/embeddings", json=PILL)
        answered = time.perf_counter() - started

        def serves() -> bool:
            body = {"input": "harmless", "model": "faulty"}
            return client.post("/v1/embeddings", json=body).status_code == 200

        if not wait_until(serves, timeout, interval=0.1):
            raise TimeoutError(f"faulty did not serve again within {timeout}s of a poison pill")
    code = answer.json().get("error", {}).get("code") if answer.status_code != 200 else None
    return {
        "status": answer.status_code,
        "code": code,
        "answered_s": answered,
        "serving_again_s": time.perf_counter() - started,
    }


def faulty_engine_pids(server: PoolserveProcess) -> list[int]:
    """The live pids of faulty's engine (engine-1: the second model's), from their log prefix."""
    live = set(server.child_pid("engine_core"))
    return sorted({int(pid) for pid in re.findall(r"\[engine-1 (\d+)\]", server.stderr()) if int(pid) in live})


def restart_twice(server: PoolserveProcess, timeout: float = 120.0) -> None:
    """faulty's engine killed (SIGKILL), twice, each time waiting until its restart serves."""
    with httpx.Client(base_url=server.url, timeout=timeout) as client:

        def replaced_and_serving(victim: int) -> bool:
            if faulty_engine_pids(server) in ([], [victim]):
                return False
            return client.post("/v1/embeddings", json={"input": "harmless", "model": "faulty"}).status_code == 200

        for _ in range(2):
            (victim,) = faulty_engine_pids(server)
            os.kill(victim, signal.SIGKILL)
            if not wait_until(functools.partial(replaced_and_serving, victim), timeout, interval=0.1):
                raise TimeoutError(f"faulty did not serve again within {timeout}s of a kill\n{server.log()}")


def finished_during(load: SteadyLoad, action: Callable[[], object]) -> tuple[list[float], float]:
    """The latencies of `load`'s requests that came back while `action` ran, and how long it ran."""
    mark = len(load.latencies)
    started = time.perf_counter()
    action()
    return load.latencies[mark:], time.perf_counter() - started


def start_server(api_servers: int, torch_threads: int) -> PoolserveProcess:
    faulty = model_folder("faulty")
    args = [
        "--model", "minilm=", "--model", f"faulty={faulty}", "--trust-remote-code",
        "--api-server-count", str(api_servers), "--torch-threads", str(torch_threads),
        "--device", "cpu", "--dtype", "float32",
    ]  # fmt: skip
    server = PoolserveProcess(*args, env=remote_code_env(faulty))
    try:
        return server.wait_ready(300)
    except BaseException:
        server.stop()
        raise


def run(rounds: int, clients: int, api_servers: int, torch_threads: int) -> dict[str, Any]:
    server = start_server(api_servers, torch_threads)
    phases: dict[str, list[float]] = {"quiet": [], "pill": [], "restarts": []}
    seconds = dict.fromkeys(phases, 0.0)
    pills = []
    try:
        with SteadyLoad(server.url, clients=clients, body=STEADY_BODY) as load:
            load.wait_for(clients * 5)
            for _ in range(rounds):
                for phase, action in (
                    ("quiet", lambda: time.sleep(QUIET_S)),
                    ("pill", lambda: pills.append(send_pill(server.url))),
                    ("quiet", lambda: time.sleep(QUIET_S)),
                    ("restarts", lambda: restart_twice(server)),
                ):
                    latencies, spent = finished_during(load, action)
                    phases[phase] += latencies
                    seconds[phase] += spent
        failures = {"failures": len(load.failures), "statuses": dict(load.statuses)}
    finally:
        server.stop()
    summary = {
        phase: {**summarize_latencies(latencies), "per_s": len(latencies) / seconds[phase], "seconds": seconds[phase]}
        for phase, latencies in phases.items()
    }
    return {"minilm": summary, "minilm_outcomes": failures, "pills": pills}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="Rounds of quiet, pill, quiet, restarts.")
    parser.add_argument("--clients", type=int, default=2, help="Closed-loop clients on minilm.")
    parser.add_argument("--api-server-count", type=int, default=1)
    parser.add_argument("--torch-threads", type=int, default=1, help="Each engine's.")
    args = parser.parse_args()
    model_folder("faulty")  # built before any timing
    load_before = os.getloadavg()[0]
    result = run(args.rounds, args.clients, args.api_server_count, args.torch_threads)
    print(json.dumps(result, indent=1))
    print(f"load average (1 min) before {load_before:.1f}, after {os.getloadavg()[0]:.1f}")
    for phase, figures in result["minilm"].items():
        print(
            f"minilm, {phase}: {figures['count']} requests, {figures['per_s']:.1f}/s, p50 {figures['p50']:.1f} ms, "
            f"p90 {figures['p90']:.1f} ms, p99 {figures['p99']:.1f} ms, max {figures['max']:.1f} ms"
        )


if __name__ == "__main__":
    main()
