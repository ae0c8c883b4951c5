from __future__ import annotations

import re

import pytest

from engine_core.config import BUNDLED_MODEL_NAME, Config, default_api_server_count
from supervisor.cli import build_parser, parse_config


def test_defaults_serve_the_bundled_model_on_loopback() -> None:
    config = parse_config([])
    assert config.host == "127.0.0.1"
    assert config.port == 8000
    assert config.model == ""
    assert config.model_names == [BUNDLED_MODEL_NAME]
    assert config.api_server_count == default_api_server_count() >= 1
    assert not config.binds_beyond_loopback


def test_every_flag_maps_to_its_field() -> None:
    config = parse_config(
        [
            "--model", "/m", "--served-model-name", "a", "b", "--host", "0.0.0.0", "--port", "9000",
            "--api-server-count", "3", "--max-batch-tokens", "4096", "--max-batch-size", "16",
            "--max-model-len", "128", "--preprocess-workers", "0", "--device", "cpu", "--dtype", "bfloat16",
            "--pooling", "cls", "--torch-threads", "2", "--trust-remote-code", "--engine-start-timeout", "12",
            "--shutdown-timeout", "3", "--log-level", "debug",
        ]
    )  # fmt: skip
    assert config == Config(
        model="/m",
        served_model_name=["a", "b"],
        host="0.0.0.0",
        port=9000,
        api_server_count=3,
        max_batch_tokens=4096,
        max_batch_size=16,
        max_model_len=128,
        preprocess_workers=0,
        device="cpu",
        dtype="bfloat16",
        pooling="cls",
        torch_threads=2,
        trust_remote_code=True,
        engine_start_timeout=12.0,
        shutdown_timeout=3.0,
        log_level="debug",
    )
    assert config.model_names == ["a", "b"]
    assert config.binds_beyond_loopback


def test_the_model_path_is_the_default_served_name() -> None:
    assert parse_config(["--model", "/models/bge"]).model_names == ["/models/bge"]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--api-server-count", "0"], "--api-server-count"),
        (["--port", "70000"], "--port"),
        (["--preprocess-workers", "-1"], "--preprocess-workers"),
        (["--max-batch-size", "-4"], "--max-batch-size"),
        (["--engine-start-timeout", "0"], "--engine-start-timeout"),
        (["--served-model-name", " "], "--served-model-name"),
        (["--port", "eighty"], "--port"),
        (["--device", "tpu"], "--device"),
    ],
)
def test_a_bad_value_fails_with_one_sentence_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_config(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert flag in err
    assert argv[1].strip() in err or argv[1] == " "


def test_help_explains_every_flag() -> None:
    text = build_parser().format_help()
    flags = set(re.findall(r"(--[a-z-]+)", text))
    for action in build_parser()._actions:
        for option in action.option_strings:
            if option.startswith("--"):
                assert option in flags
        if action.option_strings and action.dest != "help":
            assert action.help, f"{action.option_strings} has no help"
