"""The floor of a Python embedding frontend: a bare uvicorn ASGI app doing only what any must do per request.

It reads the body, msgspec-decodes it, tokenizes the texts with the bundled model's `tokenizers` tokenizer
(as poolserve's API servers do), and answers a canned reply of the right shape and size: one 384-float
embedding per input for /v1/embeddings, ranked results for /v1/rerank. No model, no engine, no limits, no
metrics. uvicorn with httptools and uvloop, one process. What poolserve's API server costs per request above
this is its own overhead (bench/request_cpu.py measures both in one run).

    python -m bench.bare_app --port 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket

import msgspec
import uvicorn
from tokenizers import Tokenizer
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from bench.harness.models import bundled_model_folder

DIM = 384


class Body(msgspec.Struct):
    input: str | list[str] | None = None
    query: str | None = None
    documents: list[str] | None = None


def embeddings_reply(count: int) -> bytes:
    rng = random.Random(count)
    data = [
        {"object": "embedding", "index": i, "embedding": [rng.uniform(-0.2, 0.2) for _ in range(DIM)]}
        for i in range(count)
    ]
    return json.dumps({"object": "list", "data": data, "model": "bare", "usage": {"prompt_tokens": 20 * count,
                       "total_tokens": 20 * count}}).encode()  # fmt: skip


def rerank_reply(count: int) -> bytes:
    results = [{"index": i, "relevance_score": 1.0 - i / count} for i in range(count)]
    return json.dumps({"id": "rerank-bare", "model": "bare", "results": results,
                       "usage": {"prompt_tokens": 20 * count, "total_tokens": 20 * count}}).encode()  # fmt: skip


class BareApp:
    def __init__(self) -> None:
        self.tokenizer = Tokenizer.from_file(str(bundled_model_folder() / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.decoder = msgspec.json.Decoder(Body)
        self.replies: dict[tuple[str, int], bytes] = {}

    def reply(self, path: str, count: int) -> bytes:
        key = (path, count)
        if key not in self.replies:
            self.replies[key] = rerank_reply(count) if path == "/v1/rerank" else embeddings_reply(count)
        return self.replies[key]

    async def __call__(self, scope: dict[str, object], receive: object, send: object) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()  # type: ignore[operator]
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = self.decoder.decode(b"".join(chunks))
        texts = [body.input] if isinstance(body.input, str) else list(body.input or [])
        if body.query is not None:
            texts = [body.query, *(body.documents or [])]
        encodings = self.tokenizer.encode_batch(texts) if len(texts) > 1 else [self.tokenizer.encode(texts[0])]
        count = len(body.documents or []) if body.query is not None else len(encodings)
        reply = self.reply(str(scope["path"]), count)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(reply)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": reply})  # type: ignore[operator]


class NoDelayProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with Nagle's algorithm off, as poolserve's acceptor sets it: a reply
    written in two sends (head, then body) otherwise waits ~40 ms for the client's delayed ACK."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    sock = socket.create_server(("127.0.0.1", args.port), backlog=1024)
    print(f"bare app listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(BareApp(), http=NoDelayProtocol, loop="uvloop", lifespan="off", access_log=False,
                            log_level="warning")  # fmt: skip
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
