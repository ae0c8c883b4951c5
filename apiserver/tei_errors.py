"""TEI's error answers: the `{"error", "error_type"}` body, and which type and status each of poolserve's errors gets.

text-embeddings-inference (router/src/lib.rs, router/src/http/server.rs) sends every error it
raises as `ErrorResponse`, whose type decides the status: Empty 400, Validation 413 (too many
inputs, too long an input, any other value it refuses), Tokenizer 422, Backend 424 (the model
failed, or cannot do what the route asks), Overloaded 429, Unhealthy 503. A body that does not
decode is axum's: 400 when it is not JSON, 422 when it does not fit the request type. The types
serialize as named (`"Validation"`), as TEI answers them.
"""

from __future__ import annotations

from typing import Literal

import msgspec

TeiErrorType = Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]


class TeiErrorBody(msgspec.Struct):
    error: str
    error_type: TeiErrorType


# poolserve's error codes whose TEI type is not the one its status implies, with TEI's status for them.
BY_CODE: dict[str, tuple[int, TeiErrorType]] = {
    "empty_input": (400, "Empty"),
    "invalid_json": (400, "Validation"),  # axum: the body is not JSON
    "invalid_body": (422, "Validation"),  # axum: JSON that is not the request type
    "task_not_supported": (424, "Backend"),  # TEI: "model is not a re-ranker model", ...
    "sparse_not_supported": (424, "Backend"),
    "engine_unavailable": (503, "Unhealthy"),
    "engine_hung": (503, "Unhealthy"),
    "overloaded": (429, "Overloaded"),
    "too_many_uploads": (429, "Overloaded"),
    "server_full": (429, "Overloaded"),
}


def tei_error(status: int, code: str | None) -> tuple[int, TeiErrorType]:
    """The status and type TEI would answer for one of poolserve's errors (its status and code)."""
    if code is not None and code in BY_CODE:
        return BY_CODE[code]
    if status in (400, 413):
        return 413, "Validation"
    if status == 429:
        return 429, "Overloaded"
    if status == 500:  # the model failed this request
        return 424, "Backend"
    if status >= 500:  # 503 and 504 keep their status: TEI has no such errors of its own
        return status, "Unhealthy" if status == 503 else "Backend"
    # 401, 404, 405, 408, 431: TEI's framework answers these with no body; the status stays.
    return status, "Validation"
