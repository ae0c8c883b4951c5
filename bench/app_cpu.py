"""CPU per request of one API server's ASGI app alone: no socket, no uvicorn, an engine that answers at once.

    python -m bench.app_cpu --requests 3000 --rounds 7

bench.request_cpu measures the whole API server under load on a shared host, where other processes' work moves
the figure by tens of percent. This drives the app that `apiserver.app.build_app` returns (the gate, the request
cycle, tokenizing, the metrics in multiprocess mode, the answer's JSON) with the same one-sentence
/v1/embeddings request, back to back in one process, and prints the CPU time per request of each round and
their minimum: a change to the layers between uvicorn and the engine shows there, by itself. Run it from another
checkout (a worktree of an earlier commit) to measure that commit's app: `python -m` puts the current folder first.

    python -m bench.app_cpu --rounds 5 --without metrics

`--without` takes parts out of the app, patched from here, so that what each costs a request is the difference
from a run with everything: `metrics` (prometheus_client's counters, gauges and histograms write nothing),
`tokenizer` (the sentence's ids, computed once, are returned without tokenizing), `vectors` (the answer's row is a
JSON array written once). For finding where the time goes only: the answers stay 200s of the same size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from typing import Any

import numpy as np
import uvloop

from bench.harness.models import bundled_model_folder

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
DIM = 384


class AnsweringEngine:
    """Answers every job with one row, after one turn of the loop (as an engine's reply arrives on a later one)."""

    def __init__(self) -> None:
        self.row = np.random.default_rng(0).standard_normal((1, DIM)).astype(np.float32)

    async def pool(self, job: Any) -> Any:
        from engine_client import PooledResult

        await asyncio.sleep(0)
        return PooledResult(self.row)

    def latest_pong(self) -> None:
        return None

    def silent_engines(self) -> list[int]:
        return []


PARTS = ("metrics", "tokenizer", "vectors")


def take_out(parts: list[str]) -> None:
    """Patches `parts` (PARTS) out of the app, before it is built."""
    if "metrics" in parts:
        from prometheus_client import metrics

        def nothing(self: object, *args: object, **kwargs: object) -> None:
            return None

        for kind, methods in ((metrics.Counter, ("inc",)), (metrics.Gauge, ("inc", "dec", "set")),
                              (metrics.Histogram, ("observe",))):  # fmt: skip
            for method in methods:
                setattr(kind, method, nothing)
    if "tokenizer" in parts:
        from apiserver.requests.tokenizer import TextTokenizer

        tokenizer = TextTokenizer((bundled_model_folder() / "tokenizer.json").read_text())
        ids = tokenizer.encode([SENTENCE])[0]

        def encode(self: TextTokenizer, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
            return [list(ids) for _ in texts]

        TextTokenizer.encode = encode  # type: ignore[method-assign]
    if "vectors" in parts:
        from apiserver.requests import responses

        row = responses.float_json(AnsweringEngine().row[0])  # the app's own JSON of the answer's row, written once
        responses.float_json = lambda values: row


def build(without: list[str]) -> Any:
    """The app as an API server builds it, over the bundled model's tokenizer, less the parts `without` names;
    metrics in multiprocess mode."""
    from poolserve.metric_files import reserve_metric_files

    reserve_metric_files()  # as apiserver/__main__.py does, before the app's metrics are made
    take_out(without)
    from apiserver.app import build_app
    from apiserver.connection.fair_accept import ServerLoad
    from apiserver.images.media import MediaFetcher
    from apiserver.images.sources import ImageLoader
    from apiserver.requests.preprocess import Preprocessor
    from apiserver.requests.state import AppState
    from apiserver.requests.tokenizer import TextTokenizer
    from poolserve.config import Config
    from poolserve.load_board import LoadBoard
    from poolserve.model_card import ModelCard

    folder = bundled_model_folder()
    card = ModelCard(
        path=str(folder), architecture="BertModel", kind="embedding", tasks=["embed", "score", "pool", "tokenize"],
        max_model_len=256, output_size=DIM, vocab_size=30522, pooling="mean", normalize=True, pad_token_id=0,
        tokenizer_json=(folder / "tokenizer.json").read_text(), device="cpu", dtype="float32",
    )  # fmt: skip
    config = Config()
    board = LoadBoard.create()
    media = MediaFetcher(max_bytes=1, timeout=1.0, allowed_local_path="")
    state = AppState(
        config=config, card=card, engine=AnsweringEngine(), tokenizer=TextTokenizer(card.tokenizer_json),
        preprocess=Preprocessor(config.preprocess_workers), images=ImageLoader(media, None, 1), server_index=0,
        started_at=0, load=ServerLoad(board, board.claim_slot(), 0),
    )  # fmt: skip
    return build_app(state)


async def measure(requests: int, rounds: int, without: list[str]) -> list[float]:
    app = build(without)
    body = json.dumps({"input": SENTENCE}).encode()
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    message = {"type": "http.request", "body": body, "more_body": False}
    statuses: set[int] = set()

    async def receive() -> dict[str, Any]:
        return message

    async def send(sent: dict[str, Any]) -> None:
        if sent["type"] == "http.response.start":
            statuses.add(sent["status"])

    async def one() -> None:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/embeddings", "raw_path": b"/v1/embeddings", "query_string": b"", "root_path": "",
            "headers": headers, "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {},
        }  # fmt: skip
        await app(scope, receive, send)

    for _ in range(min(requests, 500)):  # warm-up: every series made, every cache filled
        await one()
    if statuses != {200}:
        raise SystemExit(f"the app answered {sorted(statuses)}")
    figures = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(requests):
            await one()
        figures.append((time.process_time() - started) / requests * 1e6)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests a round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--without", default="", help=f"parts taken out, comma-separated ({', '.join(PARTS)}): what each costs"
    )
    args = parser.parse_args()
    without = [part for part in args.without.split(",") if part]
    if unknown := set(without) - set(PARTS):
        parser.error(f"--without takes {', '.join(PARTS)}, not {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix="app-cpu-metrics-") as metrics:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics  # the metric files, removed with the folder
        figures = uvloop.run(measure(args.requests, args.rounds, without))
    print(json.dumps({"checkout": os.getcwd(), "without": without, "us_per_request": [round(f, 1) for f in figures],
                      "min_us_per_request": round(min(figures), 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
