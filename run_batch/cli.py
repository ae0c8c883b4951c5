"""`launch run-batch`: a file of requests or texts through the real server, answers in a file, resumable."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import httpx
import msgspec

from poolserve.config import Config, ConfigError
from poolserve.config_flags import add_flag, flag_fields, flag_value
from poolserve.served_models import model_configs
from run_batch.inputs import InputError, InputFormat, Item, Request, Text, count_items, detect_format, read_items
from run_batch.job import BatchDriver, Counts, JobOptions
from run_batch.output import Existing, OrderedOutput, default_errors_path, recover, recover_errors
from run_batch.private_server import PrivateServer, ServerFailed

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
# The job's server listens where only the job reaches it.
NOT_FORWARDED = ("host", "port")
SERVER_BOOT_EXTRA_S = 60.0

DESCRIPTION = """\
Run a file through the same server `launch` starts (its engine and API servers, on a private loopback
port with a random API key), with many requests in flight, and write one output line per input item, in
input order.

INPUT is OpenAI's batch file (JSONL lines {"custom_id", "method": "POST", "url": "/v1/embeddings", "body"};
any POST endpoint of the server: /v1/embeddings, /v1/rerank, /score, /classify, /pooling, ...), answered
as OpenAI's batch output file: {"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error"}, where body is the endpoint's answer byte for byte. Or texts to embed: JSONL (a JSON string or an
object per line), CSV, or Parquet (with pyarrow installed), answered {"index", "id", "embedding"} per text.

A bad line (not JSON, no custom_id, a body the endpoint refuses) gets an error line and the job goes on; the
bad lines alone, with their line numbers, are listed in the errors file too (--errors).
Run the same command again after an interruption: the lines already in OUTPUT are kept and skipped
(an unfinished last line is cut off first); remove OUTPUT to start over."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch run-batch", description=DESCRIPTION, formatter_class=HelpFormatter)
    add_job_flags(parser.add_argument_group("job"))
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field in flag_fields():
        if field.name in NOT_FORWARDED:
            continue
        if field.flag.group not in groups:
            groups[field.flag.group] = parser.add_argument_group(f"server: {field.flag.group}")
        add_flag(groups[field.flag.group], field)
    return parser


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def add_job_flags(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    group.add_argument("--input", "-i", required=True, type=Path, help="The file to run.")
    group.add_argument(
        "--output", "-o", required=True, type=Path, help="Where the answers go, one JSON line per item (resumed)."
    )
    group.add_argument(
        "--errors",
        type=Path,
        default=None,
        help="Where the bad lines are listed, one JSON line each ({line, index, custom_id or id, error}), kept in "
        "step with OUTPUT when resumed. Default: beside OUTPUT, answers.jsonl -> answers.errors.jsonl.",
    )
    group.add_argument(
        "--input-format",
        choices=get_args(InputFormat),
        default="auto",
        help="auto: .csv, .parquet by suffix; JSONL whose first line has custom_id and body is OpenAI's batch file.",
    )
    group.add_argument("--text-column", default="text", help="Texts: the column (or JSON field) holding the text.")
    group.add_argument("--id-column", default=None, help="Texts: a column copied into each output line as `id`.")
    group.add_argument(
        "--texts-per-request", type=int, default=64, help="Texts: how many texts one /v1/embeddings request carries."
    )
    group.add_argument(
        "--request-options",
        default="{}",
        metavar="JSON",
        help="Texts: fields added to every /v1/embeddings body, e.g. '{\"dimensions\": 128}'.",
    )
    group.add_argument("--max-concurrency", type=int, default=16, help="Requests in flight at once.")
    group.add_argument("--no-progress", action="store_true", help="No progress bar on stderr.")


def split_argv(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The job's own flags, and the rest: `launch`'s flags, handed to the server as given."""
    job = argparse.ArgumentParser(add_help=False)
    add_job_flags(job)
    return job.parse_known_args(argv)


def check_launch_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Config:
    try:
        values = {f.name: flag_value(args, f) for f in flag_fields() if f.name not in NOT_FORWARDED}
        # The server serves every model declared; the job's own defaults follow the default (first) model.
        return model_configs(values)[0]
    except ConfigError as exc:
        parser.error(str(exc))


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = check_launch_flags(parser, args)
    _, launch_args = split_argv(argv)
    try:
        options = JobOptions(args.max_concurrency, args.texts_per_request, request_options(args.request_options))
    except ValueError as exc:
        parser.error(str(exc))
    if options.concurrency < 1 or options.texts_per_request < 1:
        parser.error("--max-concurrency and --texts-per-request must be at least 1")
    try:
        fmt = detect_format(args.input, args.input_format)
        total = count_items(args.input, fmt)
        items = read_items(args.input, fmt, args.text_column, args.id_column)
        existing = recover(args.output)
        remaining = skip_done(items, existing, args.output)
        errors = args.errors or default_errors_path(args.output)
        recover_errors(errors, existing.lines)
    except (InputError, OSError, ResumeError) as exc:
        print(f"run-batch: {exc}", file=sys.stderr)
        return 2
    if existing.lines:
        cut = f" (an unfinished last line of {existing.cut} bytes cut off)" if existing.cut else ""
        print(f"run-batch: resuming after the {existing.lines} lines already in {args.output}{cut}", file=sys.stderr)
    if existing.lines >= total:
        print(f"run-batch: {args.output} already answers all {total} items", file=sys.stderr)
        return 0
    server = PrivateServer(launch_args, api_key=config.api_key)
    try:
        server.wait_ready(config.engine_start_timeout + SERVER_BOOT_EXTRA_S)
    except ServerFailed as exc:
        server.stop()
        print(f"run-batch: {exc}\n(the server's log: {server.log.name})", file=sys.stderr)
        return EXIT_FAILED
    units = group_units(remaining, options.texts_per_request)
    started = time.perf_counter()
    counts, interrupted = Counts(), False
    try:
        counts, interrupted = asyncio.run(
            drive(server, units, args=args, options=options, total=total, done=existing.lines, errors=errors)
        )
    finally:
        code = server.stop()
    elapsed = time.perf_counter() - started
    rate = counts.done / elapsed if elapsed else 0.0
    print(
        f"run-batch: {counts.done} items written to {args.output} in {elapsed:.1f}s ({rate:.1f} items/s), "
        f"{counts.failed} with an error" + (f" (listed in {errors})" if counts.failed else ""),
        file=sys.stderr,
    )
    if interrupted:
        print("run-batch: interrupted; run the same command again to go on where it stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    if code not in (0, None):
        print(f"run-batch: the server exited with {code}; its log: {server.log.name}", file=sys.stderr)
    else:
        server.remove_log()
    return 0


async def drive(
    server: PrivateServer,
    units: Iterator[list[Item]],
    *,
    args: argparse.Namespace,
    options: JobOptions,
    total: int,
    done: int,
    errors: Path | None = None,
) -> tuple[Counts, bool]:
    """Counts, and whether SIGINT or SIGTERM cut the job short (lines written so far stay written)."""
    from tqdm import tqdm

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)  # type: ignore[union-attr]
    output = OrderedOutput(args.output, 0, errors)
    unit_name = " lines" if total and isinstance(units, RequestUnits) else " items"
    progress = tqdm(
        total=total, initial=done, unit=unit_name, file=sys.stderr, disable=args.no_progress, mininterval=0.5
    )
    limits = httpx.Limits(max_connections=options.concurrency, max_keepalive_connections=options.concurrency)
    client = httpx.AsyncClient(
        base_url=server.url,
        headers={"authorization": f"Bearer {server.api_key}"},
        timeout=httpx.Timeout(None),
        limits=limits,
    )
    driver = BatchDriver(client, output, options, progress)
    try:
        await driver.run(units, 0)
        return driver.counts, False
    except asyncio.CancelledError:
        return driver.counts, True
    finally:
        output.close()
        progress.close()
        await client.aclose()


class RequestUnits:
    """OpenAI lines: one request each."""

    def __init__(self, items: Iterator[Item]) -> None:
        self.items = items

    def __iter__(self) -> Iterator[list[Item]]:
        return self

    def __next__(self) -> list[Item]:
        return [next(self.items)]


def group_units(items: Iterator[Item], size: int) -> Iterator[list[Item]]:
    """OpenAI lines one per unit; texts in groups of `size`, one /v1/embeddings request each."""
    first = next(items, None)
    if first is None:
        return iter(())
    rest = itertools.chain([first], items)
    if isinstance(first, Request):
        return RequestUnits(rest)
    return iter(lambda: list(itertools.islice(rest, size)), [])


class ResumeError(Exception):
    """OUTPUT holds lines that do not answer INPUT's first items: resuming would mix two jobs."""


def skip_done(items: Iterator[Item], existing: Existing, output: Path) -> Iterator[Item]:
    """`items` past those the output already answers, once its last line is found to answer the item at
    its position."""
    if not existing.lines:
        return items
    for item in items:
        if item.index == existing.lines - 1:
            check_continues(item, existing.last, output)
            return items
    raise ResumeError(f"{output} has {existing.lines} lines, more than the input has items; remove it to start over")


def check_continues(item: Item, last: bytes, output: Path) -> None:
    try:
        line: Any = msgspec.json.decode(last)
    except msgspec.DecodeError:
        line = None
    expected: str | int | None
    if isinstance(item, Request):
        expected, key = item.custom_id, "custom_id"
    else:
        expected, key = item.index, "index"
    found = line.get(key, "(none)") if isinstance(line, dict) else "(not a JSON object)"
    if found != expected or (isinstance(item, Text) and line.get("id") != item.id):
        raise ResumeError(
            f"{output} does not continue this input: its line {item.index + 1} has {key} {found!r}, the input's "
            f"item {item.index + 1} (line {item.line}) {expected!r}; give another --output or remove it to start over"
        )


def request_options(raw: str) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ValueError(f"--request-options is not JSON: {exc}") from None
    if not isinstance(value, dict) or "input" in value:
        raise ValueError("--request-options must be a JSON object of /v1/embeddings fields other than input")
    return value
