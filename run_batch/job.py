"""Runs a job's items through the server: many requests in flight, answers written in input order.

A unit of work is one OpenAI batch line (one request, its answer kept byte for byte) or a group of
texts (one /v1/embeddings request; each text's vector cut out of the answer as the bytes the server
wrote). Units are numbered; the output writes them in that order however they finish.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import msgspec

from run_batch.inputs import Item, Request, Text
from run_batch.output import OrderedOutput

# Answers that mean "later" rather than "no": the admission limit (429) and an engine restarting (503).
RETRY_STATUSES = frozenset({429, 502, 503})
MAX_ATTEMPTS = 8
RETRY_BASE_S = 0.25
encoder = msgspec.json.Encoder()


class Progress(Protocol):
    def update(self, n: int) -> object: ...

    def write(self, s: str) -> object: ...


@dataclass(frozen=True, slots=True)
class JobOptions:
    concurrency: int
    texts_per_request: int
    request_options: dict[str, Any]


@dataclass(slots=True)
class Counts:
    done: int = 0
    failed: int = 0


class ResponseBody(msgspec.Struct):
    status_code: int
    request_id: str
    body: msgspec.Raw


class LineError(msgspec.Struct):
    code: str
    message: str


class OutputLine(msgspec.Struct):
    """OpenAI's batch output line (vLLM's run-batch writes the same)."""

    id: str
    custom_id: str | None
    response: ResponseBody | None
    error: LineError | None


class EmbeddingRow(msgspec.Struct):
    index: int
    embedding: msgspec.Raw


class EmbeddingAnswer(msgspec.Struct):
    data: list[EmbeddingRow]


class ErrorBody(msgspec.Struct):
    error: dict[str, Any] | str


# An item's output line, and its errors-file line when it failed (run_batch/output.py).
Written = tuple[bytes, bytes | None]


class Answer(msgspec.Struct):
    status: int
    request_id: str
    body: bytes
    is_json: bool


class BatchDriver:
    def __init__(self, client: httpx.AsyncClient, output: OrderedOutput, options: JobOptions, progress: Progress):
        self.client = client
        self.output = output
        self.options = options
        self.progress = progress
        self.counts = Counts()
        self.slots = asyncio.Semaphore(options.concurrency)
        # A unit may start only this far ahead of the first one not yet written: one slow unit cannot make
        # the answers waiting behind it grow without bound.
        self.window = options.concurrency * 8
        self.written = asyncio.Condition()
        self.error: Exception | None = None

    async def run(self, units: Iterator[list[Item]], first_seq: int) -> Counts:
        tasks: set[asyncio.Task[None]] = set()
        for seq, unit in enumerate(units, start=first_seq):
            async with self.written:
                while seq >= self.output.next + self.window and self.error is None:
                    await self.written.wait()
            if self.error is not None:
                break
            await self.slots.acquire()
            task = asyncio.create_task(self.finish(seq, unit))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)
        if self.error is not None:
            raise self.error
        return self.counts

    async def finish(self, seq: int, unit: list[Item]) -> None:
        try:
            answered = await self.answer_unit(unit)
        except Exception as exc:  # a fault of the job itself, not of an item: stop, keeping what is written
            self.error = self.error or exc
            async with self.written:
                self.written.notify_all()
            return
        finally:
            self.slots.release()
        lines = [line for line, _ in answered]
        errors = [error for _, error in answered if error is not None]
        async with self.written:
            written = self.output.put(seq, lines, errors)
            self.written.notify_all()
        self.counts.done += written
        self.progress.update(written)

    async def answer_unit(self, unit: list[Item]) -> list[Written]:
        """Each item's output line, and its errors-file line when it failed."""
        first = unit[0]
        if isinstance(first, Request):
            return [await self.answer_request(first)]
        texts = [item for item in unit if isinstance(item, Text)]
        return await self.answer_texts(texts)

    # OpenAI batch lines ----------------------------------------------------------------------------

    async def answer_request(self, item: Request) -> Written:
        line_id = f"batch_req_{uuid.uuid4().hex}"
        if item.problem is not None:
            self.report(item.problem)
            refused = LineError("invalid_request", item.problem)
            line = encoder.encode(OutputLine(line_id, item.custom_id, None, refused)) + b"\n"
            return line, error_record(item, refused)
        answer = await self.post(item.url, item.body)
        body = answer.body if answer.is_json else encoder.encode(answer.body.decode(errors="replace"))
        response = ResponseBody(answer.status, answer.request_id, msgspec.Raw(body))
        error: LineError | None = None
        if answer.status != 200:
            error = error_of(answer)
            self.report(f"line {item.line}: {answer.status} {error.message}")
        line = encoder.encode(OutputLine(line_id, item.custom_id, response, error)) + b"\n"
        return line, None if error is None else error_record(item, error, answer.status)

    # Texts ------------------------------------------------------------------------------------------

    async def answer_texts(self, texts: list[Text]) -> list[Written]:
        """One line per text: its vector, or its error. A group the server refuses is tried text by text, so
        one bad text costs only its own line."""
        lines: dict[int, Written] = {}
        good = []
        for text in texts:
            if text.problem is None:
                good.append(text)
            else:
                self.report(text.problem)
                lines[text.index] = text_error_line(text, LineError("invalid_request", text.problem))
        if good:
            lines.update(await self.embed(good))
        return [lines[text.index] for text in texts]

    async def embed(self, texts: list[Text]) -> dict[int, Written]:
        body = encoder.encode({**self.options.request_options, "input": [text.text for text in texts]})
        answer = await self.post("/v1/embeddings", body)
        if answer.status == 200:
            rows = msgspec.json.decode(answer.body, type=EmbeddingAnswer).data
            vectors = {row.index: row.embedding for row in rows}
            return {
                text.index: (
                    encoder.encode({"index": text.index, "id": text.id, "embedding": vectors[k]}) + b"\n",
                    None,
                )
                for k, text in enumerate(texts)
            }
        if len(texts) > 1 and answer.status < 500:
            lines: dict[int, Written] = {}
            for text in texts:
                lines.update(await self.embed([text]))
            return lines
        error = error_of(answer)
        text = texts[0]
        self.report(f"line {text.line}: {answer.status} {error.message}")
        return {text.index: text_error_line(text, error, answer.status)}

    # HTTP -------------------------------------------------------------------------------------------

    async def post(self, path: str, body: bytes) -> Answer:
        """The server's answer; a refusal that means "later" (429, 503) or a lost connection is tried again
        with backoff, and after MAX_ATTEMPTS becomes the answer (or a 503 naming the error)."""
        for attempt in range(MAX_ATTEMPTS):
            try:
                response = await self.client.post(path, content=body, headers={"content-type": "application/json"})
            except httpx.TransportError as exc:
                if attempt == MAX_ATTEMPTS - 1:
                    message = encoder.encode({"error": {"message": f"{type(exc).__name__}: {exc}", "code": 503}})
                    return Answer(503, "", message, True)
            else:
                if response.status_code not in RETRY_STATUSES or attempt == MAX_ATTEMPTS - 1:
                    is_json = response.headers.get("content-type", "").startswith("application/json")
                    return Answer(
                        response.status_code, response.headers.get("x-request-id", ""), response.content, is_json
                    )
            await asyncio.sleep(RETRY_BASE_S * 2**attempt)
        raise AssertionError("unreachable")

    def report(self, message: str) -> None:
        self.counts.failed += 1
        self.progress.write(f"run-batch: {message}")


def error_of(answer: Answer) -> LineError:
    """The server's own error message and type from its body (OpenAI's, vLLM's or TEI's shape)."""
    message, code = answer.body.decode(errors="replace"), f"http_{answer.status}"
    if answer.is_json:
        try:
            error = msgspec.json.decode(answer.body, type=ErrorBody).error
        except msgspec.DecodeError:
            pass
        else:
            if isinstance(error, dict):
                message = str(error.get("message", message))
                code = str(error.get("type") or error.get("code") or code)
            else:
                message = error
    return LineError(code, message)


def text_error_line(text: Text, error: LineError, status: int | None = None) -> Written:
    said: dict[str, Any] = {"code": error.code, "message": error.message, "line": text.line}
    if status is not None:
        said["status_code"] = status
    return encoder.encode({"index": text.index, "id": text.id, "error": said}) + b"\n", error_record(
        text, error, status
    )


def error_record(item: Item, error: LineError, status: int | None = None) -> bytes:
    """The errors file's line for a bad item: where it is in the input (its line number, from 1, and its position
    among the items, which OUTPUT's line answers it), its custom_id or id, and what is wrong."""
    record: dict[str, Any] = {"line": item.line, "index": item.index}
    if isinstance(item, Request):
        record["custom_id"] = item.custom_id
    else:
        record["id"] = item.id
    record["error"] = {"code": error.code, "message": error.message}
    if status is not None:
        record["error"]["status_code"] = status
    return encoder.encode(record) + b"\n"
