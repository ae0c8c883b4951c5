"""The API-key and body-size middleware on a small Starlette app: what passes, what gets 401 and 413."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from apiserver.auth import OPEN_PATHS, ApiKeyAuth, bearer_token, open_paths
from apiserver.body_limit import BodySizeLimit
from apiserver.errors import EXCEPTION_HANDLERS

KEY = "k-3xampl3"
LIMIT = 1000


async def echo_size(request: Request) -> Response:
    return PlainTextResponse(str(len(await request.body())))


@pytest.fixture
def client() -> Iterator[TestClient]:
    app = Starlette(
        routes=[Route(path, echo_size, methods=["GET", "POST"]) for path in ("/v1/embeddings", "/health", "/metrics")],
        middleware=[
            Middleware(ApiKeyAuth, api_key=KEY, exempt=open_paths(protect_metrics=False)),
            Middleware(BodySizeLimit, limit=LIMIT),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
    )
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
