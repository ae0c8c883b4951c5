"""/openapi.json, generated from the msgspec types that decode the requests and encode the answers."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import msgspec

from apiserver.errors import TEI, ErrorBody
from apiserver.requests.endpoints import Endpoint
from apiserver.tei_errors import TeiErrorBody

REF = "#/components/schemas/{name}"
API_KEY_SCHEME = "apiKey"


def openapi_document(
    endpoints: Sequence[Endpoint], version: str, open_paths: Collection[str] | None = None
) -> dict[str, Any]:
    """`open_paths`: when the server requires an API key, the paths that need none; None when none is required."""
    types: list[Any] = [ErrorBody, TeiErrorBody]
    for endpoint in endpoints:
        types.extend(t for t in (endpoint.request, endpoint.response) if t is not None)
    schemas, components = msgspec.json.schema_components(types, ref_template=REF)
    schema_of = dict(zip(map(id, types), schemas, strict=True))
    openai, tei = schema_of[id(ErrorBody)], schema_of[id(TeiErrorBody)]
    errors = {
        "openai": {"description": "An OpenAI-style error.", "content": {"application/json": {"schema": openai}}},
        "tei": {"description": "A TEI-style error.", "content": {"application/json": {"schema": tei}}},
        "either": {
            "description": "A TEI-style error for a TEI body, else an OpenAI-style one.",
            "content": {"application/json": {"schema": {"anyOf": [openai, tei]}}},
        },
    }
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        operation: dict[str, Any] = {
            "summary": endpoint.summary,
            "operationId": f"{endpoint.method.lower()}_{endpoint.path.strip('/').replace('/', '_') or 'root'}",
            "tags": [endpoint.tag],
            "responses": {"default": errors[error_kind(endpoint)]},
        }
        if endpoint.request is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema_of[id(endpoint.request)]}},
            }
        if endpoint.response is not None:
            operation["responses"]["200"] = {
                "description": "Success.",
                "content": {"application/json": {"schema": schema_of[id(endpoint.response)]}},
            }
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = operation
    paths["/openapi.json"] = {
        "get": {
            "summary": "This document.",
            "operationId": "get_openapi",
            "tags": ["server"],
            "responses": {"200": {"description": "The OpenAPI document.", "content": {"application/json": {}}}},
        }
    }
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "poolserve", "version": version},
        "paths": paths,
        "components": {"schemas": components},
    }
    if open_paths is not None:
        document["components"]["securitySchemes"] = {API_KEY_SCHEME: {"type": "http", "scheme": "bearer"}}
        for path, operations in paths.items():
            for operation in operations.values():
                operation["security"] = [] if path in open_paths else [{API_KEY_SCHEME: []}]
    return document


def error_kind(endpoint: Endpoint) -> str:
    if endpoint.error_style == TEI:
        return "tei"
    is_chosen_by_body = endpoint.operation is not None and endpoint.operation.error_style is not None
    return "either" if is_chosen_by_body else "openai"


def encode_openapi(endpoints: Sequence[Endpoint], version: str, open_paths: Collection[str] | None = None) -> bytes:
    return msgspec.json.encode(openapi_document(endpoints, version, open_paths))
