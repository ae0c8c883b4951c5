"""The `launch` command: flags to a Config, then the supervisor."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import msgspec

from poolserve.config import Config, ConfigError
from poolserve.config_flags import add_flag, configs_of, flag_fields
from poolserve.logs import configure_logging
from supervisor.arbiter import Supervisor


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch",
        description=(
            "Serve a pooling model (embeddings, late-interaction ColBERT, rerankers, classifiers, CLIP) over HTTP: "
            "N API-server "
            "processes share one listening socket and feed one engine-core process that owns the model "
            "and batches across all of them."
        ),
        epilog=(
            "launch run-batch --input FILE --output FILE [these flags]: run a file (OpenAI's batch JSONL, or texts "
            "in JSONL, CSV or Parquet) through the same server, answers in input order, resumable; "
            "`launch run-batch --help` says more. "
            "launch prepare [these flags]: make what a start of these flags caches (the model's files, and the ONNX "
            "graph --runtime auto serves a BERT embedder through on a CPU) and exit; `launch prepare --help` says "
            "more."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field in flag_fields():  # sections show in the order their first field has in Config
        if field.flag.group not in groups:
            groups[field.flag.group] = parser.add_argument_group(field.flag.group)
        add_flag(groups[field.flag.group], field)
    return parser


PREPARE_DESCRIPTION = (
    "Make what a start of these flags would cache, for each model they name, then exit: the model's files (into "
    "Hugging Face's cache, where the hub can be reached) and, where the engine would serve the model through ONNX "
    "Runtime's graph (--runtime auto on a CPU for a BERT embedder served in float32 or int8), the graph exported, "
    "optimised and packed into --onnx-cache-dir and held to torch as a start holds it. Each model is loaded as an "
    "engine loads it: one that a server could not serve fails here. Run it where an image is built, or in an init "
    "container on the servers' cache volume: a first start on an empty cache serves through torch, slower, until "
    "its graph is made. Exit status 0 when every model is prepared, 1 with the reason otherwise."
)


def parse_configs(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> list[Config]:
    """Each model's Config (one, unless --model is repeated or --config lists several), the default first."""
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    try:
        return configs_of(args, flag_fields())
    except ConfigError as exc:
        parser.error(str(exc))


def parse_config(argv: list[str] | None = None) -> Config:
    """The default model's Config: the whole of it for a one-model server."""
    return parse_configs(argv)[0]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["run-batch"]:
        from run_batch.cli import main as run_batch

        sys.exit(run_batch(args[1:]))
    if args[:1] == ["prepare"]:
        sys.exit(prepare(args[1:]))
    configs = parse_configs(argv)
    config = configs[0]
    configure_logging("supervisor", config.log_level, config.log_format)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    sys.exit(Supervisor(config, configs).run())


def prepare(argv: list[str]) -> int:
    """`launch prepare`: the flags checked here, the models loaded by engine_core/prepare.py in a process of its own
    (torch is the engine's, not the supervisor's)."""
    parser = build_parser()
    parser.prog, parser.description, parser.epilog = "launch prepare", PREPARE_DESCRIPTION, None
    configs = parse_configs(argv, parser)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    command = [sys.executable, "-m", "engine_core.prepare"]
    return subprocess.run(command, input=msgspec.json.encode(configs), check=False).returncode
