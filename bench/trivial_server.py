"""A near-zero-work HTTP/1.1 server: the target that measures the load generator's own ceiling.

It answers every request with the same small JSON body and an `x-poolserve-server: 0` header,
from an asyncio Protocol on uvloop with httptools parsing requests; whatever rate the generator
reaches against it is the most it could ever report against a real server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket

OK_BODY = b'{"status":"ok"}'


def make_response(body: bytes) -> bytes:
    head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-poolserve-server: 0\r\n"
    return head.encode() + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body


def canned_embeddings(items: int, dim: int) -> bytes:
    """An OpenAI embeddings reply of `items` vectors of `dim` floats, shaped and sized like the real
    one, so the generator's ceiling includes reading replies as large as the server's."""
    rng = random.Random(0)
    data = [
        {"object": "embedding", "index": i, "embedding": [rng.uniform(-0.2, 0.2) for _ in range(dim)]}
        for i in range(items)
    ]
    usage = {"prompt_tokens": 20 * items, "total_tokens": 20 * items}
    return json.dumps({"object": "list", "data": data, "model": "trivial", "usage": usage}).encode()


class TrivialProtocol(asyncio.Protocol):
    response = make_response(OK_BODY)

    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except Exception:
            if self.transport is not None:
                self.transport.close()

    def on_message_complete(self) -> None:
        if self.transport is not None:
            self.transport.write(self.response)


async def serve(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(TrivialProtocol, sock=sock, backlog=1024)
    async with server:
        await server.serve_forever()


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--reply-items", type=int, default=0, help="Answer an embeddings reply of N vectors.")
    parser.add_argument("--reply-dim", type=int, default=384, help="Length of each canned vector.")
    args = parser.parse_args()
    if args.reply_items:
        TrivialProtocol.response = make_response(canned_embeddings(args.reply_items, args.reply_dim))
    import uvloop

    sock = bind(args.host, args.port)
    # The sweep reads this line for the port, as it reads poolserve's ready line.
    print(f"trivial server listening on http://{args.host}:{sock.getsockname()[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(sock))


if __name__ == "__main__":
    main()
