"""The gate's API-key and body checks (apiserver/connection/gate.py) in front of a small Starlette app: what passes,
what gets 401, 413 and 503, and what a body holds of the server's budget while it is in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient
from starlette.types import Message

from apiserver.connection.auth import OPEN_PATHS, ApiKey, bearer_token, open_paths
from apiserver.connection.body_limit import BodyBudget, BodyLimit
from apiserver.connection.fair_accept import ServerLoad
from apiserver.connection.gate import Gate, Handler
from apiserver.connection.telemetry import Telemetry
from apiserver.errors import EXCEPTION_HANDLERS, ApiError
from apiserver.requests.limits import body_bytes_in_flight_limit
from poolserve.config import MIB, Config, ConfigError
from poolserve.load_board import LoadBoard

KEY = "k-3xampl3"
LIMIT = 1000


async def echo_size(request: Request) -> Response:
    return PlainTextResponse(str(len(await request.body())))


def gated(routes: dict[str, Handler], *, limit: int, budget: BodyBudget, key: str | None = None) -> Gate:
    """The gate over a Starlette app serving `routes` (GET and POST each), as apiserver/app.py builds it."""
    app = Starlette(
        routes=[Route(path, handler, methods=["GET", "POST"]) for path, handler in routes.items()],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    board = LoadBoard.create()
    return Gate(
        app,
        {(method, path): handler for path, handler in routes.items() for method in ("GET", "POST")},
        telemetry=Telemetry(server_index=0, endpoints=routes, access_log=False, cache_hits_header=False),
        load=ServerLoad(board, board.claim_slot(), server_index=0),
        bodies=BodyLimit(limit, budget),
        key=None if key is None else ApiKey(key, open_paths(protect_metrics=False)),
        exception_handlers=EXCEPTION_HANDLERS,
    )


@pytest.fixture
def client() -> Iterator[TestClient]:
    paths = ("/v1/embeddings", "/health", "/metrics")
    app = gated(dict.fromkeys(paths, echo_size), limit=LIMIT, budget=BodyBudget(4 * LIMIT), key=KEY)
    with TestClient(app) as test_client:
        yield test_client


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (b"Bearer abc", b"abc"),
        (b"bearer abc", b"abc"),
        (b"  BEARER   abc  ", b"abc"),
        (b"Basic abc", None),
        (b"abc", None),
        (b"Bearer", b""),
    ],
)
def test_the_bearer_token_is_read_from_the_authorization_header(header: bytes, token: bytes | None) -> None:
    assert bearer_token(header) == token


def test_probes_are_open_and_metrics_only_without_protect_metrics() -> None:
    assert {"/health", "/health/ready", "/health/live", "/ping"} <= OPEN_PATHS
    assert "/metrics" in open_paths(protect_metrics=False)
    assert "/metrics" not in open_paths(protect_metrics=True)


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong"}, {"authorization": KEY}, {"authorization": f"Basic {KEY}"},
     {"authorization": f"Bearer {KEY}x"}, {"authorization": f"Bearer {KEY[:-1]}"}, {"x-api-key": KEY}],
)  # fmt: skip
def test_a_missing_or_wrong_key_is_a_401_with_an_openai_body(client: TestClient, headers: dict[str, str]) -> None:
    response = client.post("/v1/embeddings", content=b"{}", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["type"] == "authentication_error"
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert KEY not in response.text


def test_the_right_key_passes_and_open_paths_need_none(client: TestClient) -> None:
    assert client.post("/v1/embeddings", content=b"{}", headers={"authorization": f"Bearer {KEY}"}).text == "2"
    assert client.get("/health").status_code == 200
    assert client.get("/metrics").status_code == 200
    # Unknown paths are refused too: the key is asked for before the route is looked up.
    assert client.get("/nowhere").status_code == 401
    assert client.get("/health/").status_code == 401


def test_a_declared_body_over_the_limit_is_a_413_naming_the_limit(client: TestClient) -> None:
    response = client.post("/health", content=b"x" * (LIMIT + 1))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert f"limit of {LIMIT} bytes (--max-request-bytes)" in response.json()["error"]["message"]
    assert client.post("/health", content=b"x" * LIMIT).text == str(LIMIT)


def test_a_chunked_body_is_counted_as_it_arrives(client: TestClient) -> None:
    def chunks(total: int) -> Iterator[bytes]:
        for _ in range(total // 100):
            yield b"x" * 100

    response = client.post("/health", content=chunks(LIMIT + 100))
    assert response.status_code == 413
    assert "content-length" not in response.request.headers
    assert client.post("/health", content=chunks(LIMIT)).text == str(LIMIT)


# The budget of bodies in flight (--max-body-bytes-in-flight) -----------------------------------------------


async def read_then_answer(request: Request) -> Response:
    body = await request.body()
    if body.startswith(b"fail"):
        raise ApiError(400, "refused after reading")
    return PlainTextResponse(str(len(body)))


class Upload:
    """One request driven by hand through the ASGI app: its body fed piece by piece, its answer collected."""

    def __init__(self, app: Gate, size: int | None):
        headers = (
            [(b"content-length", str(size).encode())] if size is not None else [(b"transfer-encoding", b"chunked")]
        )
        self.scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/upload", "raw_path": b"/upload", "query_string": b"", "root_path": "",
            "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
        }  # fmt: skip
        self.incoming: asyncio.Queue[Message] = asyncio.Queue()
        self.sent: list[Message] = []
        self.was_read = False
        self.task = asyncio.ensure_future(app(self.scope, self.receive, self.send))

    async def receive(self) -> Message:
        self.was_read = True
        return await self.incoming.get()

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def feed(self, data: bytes, more: bool = True) -> None:
        self.incoming.put_nowait({"type": "http.request", "body": data, "more_body": more})

    def disconnect(self) -> None:
        self.incoming.put_nowait({"type": "http.disconnect"})

    async def answer(self) -> tuple[int, dict[bytes, bytes], bytes]:
        await asyncio.wait_for(self.task, 5)
        start = self.sent[0]
        body = b"".join(m.get("body", b"") for m in self.sent[1:])
        return start["status"], dict(start["headers"]), body


def budget_app(limit: int = LIMIT, budget: int = 3 * LIMIT) -> tuple[Gate, BodyBudget]:
    gauge = BodyBudget(budget)
    return gated({"/upload": read_then_answer}, limit=limit, budget=gauge), gauge


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_held_uploads_fill_the_budget_and_the_next_one_gets_503_unread() -> None:
    async def scenario() -> None:
        app, budget = budget_app()
        held = [Upload(app, LIMIT) for _ in range(3)]
        for upload in held:
            upload.feed(b"x" * (LIMIT - 1))  # all but the last byte
        await settle()
        assert budget.held == 3 * LIMIT
        refused = Upload(app, 10)
        status, headers, body = await refused.answer()
        assert (status, headers[b"retry-after"]) == (503, b"1")
        assert b"too_many_uploads" in body and b"--max-body-bytes-in-flight" in body
        assert not refused.was_read
        chunked = Upload(app, None)  # a chunked body is refused unread too while the budget is spent
        assert (await chunked.answer())[0] == 503 and not chunked.was_read
        held[0].feed(b"x", more=False)
        assert (await held[0].answer())[:1] == (200,)
        assert budget.held == 2 * LIMIT
        later = Upload(app, LIMIT)
        later.feed(b"y" * LIMIT, more=False)
        assert (await later.answer())[2] == str(LIMIT).encode()
        for upload in held[1:]:
            upload.disconnect()
            assert (await upload.answer())[0] == 499
        assert budget.held == 0

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("declared", "pieces", "status"),
    [
        (5, [b"hello"], 200),  # success
        (4, [b"fail"], 400),  # the route refuses after reading
        (None, [b"fail"], 400),  # the same, chunked
        (None, [b"x" * 600, b"x" * 600], 413),  # chunked past --max-request-bytes
        (600, [b"x" * 300], 499),  # the client goes away mid-body
        (None, [b"x" * 300], 499),  # the same, chunked
        (None, [b"x" * 500, b"x" * 500], 503),  # chunked past the budget as its bytes arrive
    ],
)
def test_every_way_a_request_ends_gives_its_bytes_back(declared: int | None, pieces: list[bytes], status: int) -> None:
    async def scenario() -> None:
        app, budget = budget_app(limit=LIMIT, budget=LIMIT + 100)
        other = Upload(app, 150)  # another request holds 150 bytes throughout
        await settle()
        upload = Upload(app, declared)
        for piece in pieces:
            upload.feed(piece)
        if status == 499:
            await settle()
            assert budget.held == 150 + (declared or len(pieces[0]))
            upload.disconnect()
        else:
            upload.feed(b"", more=False)
        assert (await upload.answer())[0] == status
        assert budget.held == 150
        other.feed(b"x" * 150, more=False)
        assert (await other.answer())[0] == 200
        assert budget.held == 0

    asyncio.run(scenario())


def test_the_budget_defaults_to_four_of_the_largest_bodies_and_cannot_be_below_one() -> None:
    assert body_bytes_in_flight_limit(Config(), 32 * MIB) == 4 * 32 * MIB  # a model that takes images
    assert body_bytes_in_flight_limit(Config(), 4 * MIB) == 16 * MIB  # a text-only model
    assert body_bytes_in_flight_limit(Config(max_body_bytes_in_flight=3 * MIB, max_request_bytes=MIB), MIB) == 3 * MIB
    assert body_bytes_in_flight_limit(Config(max_body_bytes_in_flight=5 * MIB), 32 * MIB) == 32 * MIB
    with pytest.raises(ConfigError, match="--max-body-bytes-in-flight has value 1000; it must be 0 or at least"):
        Config(max_body_bytes_in_flight=1000, max_request_bytes=2048)
