from __future__ import annotations

import argparse
import re
from pathlib import Path

import msgspec
import pytest

from apiserver.requests.limits import IMAGE_MODEL_BODY_BYTES
from poolserve.config import API_KEY_ENV, BUNDLED_MODEL_NAME, Config, default_api_server_count
from supervisor.arbiter import ready_line
from supervisor.cli import build_parser, main, parse_config

OTEL_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG")
# The fields whose flag's default is an environment variable's.
FROM_ENVIRONMENT = {"api_key", "otlp_endpoint", "otlp_service_name", "trace_sampler", "trace_sampler_arg"}


def test_defaults_serve_the_bundled_model_on_loopback() -> None:
    config = parse_config([])
    assert config.host == "127.0.0.1"
    assert config.port == 8000
    assert config.model == ""
    assert config.model_names == [BUNDLED_MODEL_NAME]
    assert config.api_server_count == default_api_server_count() >= 1
    assert not config.binds_beyond_loopback


def test_dtype_takes_int8() -> None:
    assert parse_config(["--dtype", "int8"]).dtype == "int8"


def test_every_flag_maps_to_its_field() -> None:
    config = parse_config(
        [
            "--model", "/m", "--served-model-name", "a", "b", "--host", "0.0.0.0", "--port", "9000",
            "--api-server-count", "3", "--max-batch-tokens", "4096", "--max-batch-size", "16",
            "--max-model-len", "128", "--preprocess-workers", "0", "--device", "cpu", "--dtype", "bfloat16",
            "--token-packing", "off", "--runtime", "torch", "--onnx-cache-dir", "/c",
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
        token_packing="off",
        runtime="torch",
        onnx_cache_dir="/c",
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
        (["--engine-count", "0"], "--engine-count"),
        (["--engine-count", "17"], "--engine-count"),
        (["--port", "70000"], "--port"),
        (["--preprocess-workers", "-1"], "--preprocess-workers"),
        (["--max-batch-size", "-4"], "--max-batch-size"),
        (["--engine-start-timeout", "0"], "--engine-start-timeout"),
        (["--served-model-name", " "], "--served-model-name"),
        (["--port", "eighty"], "--port"),
        (["--device", "tpu"], "--device"),
        (["--max-request-bytes", "10"], "--max-request-bytes"),
        (["--max-tokens-per-request", "0"], "--max-tokens-per-request"),
        (["--max-images-per-request", "-1"], "--max-images-per-request"),
        (["--allowed-media-domains", "http://x.com/"], "--allowed-media-domains"),
        (["--cors-allowed-origins", "https://app.example.com/"], "--cors-allowed-origins"),
        (["--cors-allowed-origins", "app.example.com"], "--cors-allowed-origins"),
        (["--plugin", "nope"], "--plugin"),
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


def test_an_unknown_plugin_stops_launch_naming_it_and_the_installed_ones(
    plugin_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`launch`'s own main, as its console script runs it: it stops before it starts a process (the plugin served:
    tests/in_process/test_plugins.py). The example plugin is found where `launch` finds one, on the import path."""
    monkeypatch.syspath_prepend(plugin_path)
    with pytest.raises(SystemExit) as caught:
        main(["--plugin", "nope"])
    assert caught.value.code == 2
    assert "--plugin has value 'nope', which is not an installed plugin; installed: example." in capsys.readouterr().err


def test_help_explains_every_flag() -> None:
    text = build_parser().format_help()
    flags = set(re.findall(r"(--[a-z-]+)", text))
    for action in build_parser()._actions:
        for option in action.option_strings:
            if option.startswith("--"):
                assert option in flags
        if action.option_strings and action.dest != "help":
            assert action.help, f"{action.option_strings} has no help"


def test_the_security_flags_map_to_their_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    config = parse_config(
        [
            "--api-key", "k1", "--protect-metrics", "--max-request-bytes", "4096", "--max-tokens-per-request", "99",
            "--max-images-per-request", "0", "--allowed-media-domains", "a.example.com", "b.example.com",
            "--allow-private-media-urls", "--cors-allowed-origins", "https://app.example.com", "http://localhost:3000",
        ]
    )  # fmt: skip
    assert config == Config(
        api_key="k1",
        protect_metrics=True,
        max_request_bytes=4096,
        max_tokens_per_request=99,
        max_images_per_request=0,
        allowed_media_domains=["a.example.com", "b.example.com"],
        allow_private_media_urls=True,
        cors_allowed_origins=["https://app.example.com", "http://localhost:3000"],
    )


def test_defaults_are_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    config = parse_config([])
    assert config.api_key == ""
    assert not config.allow_private_media_urls
    assert config.allowed_media_domains == []
    assert config.cors_allowed_origins == []
    # One image of the largest size allowed still fits in a request as a base64 data URL, with room for JSON.
    assert config.max_image_bytes * 4 / 3 + 64 * 1024 < IMAGE_MODEL_BODY_BYTES
    assert config.max_request_bytes == 0  # chosen by model: request_body_limit
    assert config.max_tokens_per_request <= config.max_queued_tokens  # a request at the limit fits the queue


def test_the_api_key_comes_from_the_environment_unless_the_flag_gives_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert parse_config([]).api_key == "from-env"
    assert parse_config(["--api-key", "from-flag"]).api_key == "from-flag"
    assert "from-env" not in build_parser().format_help()


@pytest.mark.parametrize("key", ["with space", "tab\tkey", "caf\u00e9"])
def test_a_key_that_cannot_travel_in_a_header_is_refused_without_echoing_it(
    key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--api-key", key])
    err = capsys.readouterr().err
    assert "--api-key" in err
    assert key not in err


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [(["--api-key", ""], None, "--api-key"), ([], "", API_KEY_ENV), (["--api-key", ""], "from-env", "--api-key")],
)
def test_an_empty_api_key_from_the_flag_or_the_environment_is_refused_naming_where_it_came_from(
    argv: list[str], env: str | None, named: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An empty key once started a server with no authentication and no warning.
    if env is None:
        monkeypatch.delenv(API_KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(API_KEY_ENV, env)
    with pytest.raises(SystemExit):
        parse_config(argv)
    reason = capsys.readouterr().err.strip().splitlines()[-1]
    assert reason.startswith(f"launch: error: {named} is set but empty;")
    assert reason.count(".") == 1 and reason.endswith(".")


def test_no_api_key_anywhere_runs_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert parse_config([]).api_key == ""


def test_protect_metrics_needs_a_key(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(SystemExit):
        parse_config(["--protect-metrics"])
    assert "--protect-metrics needs an API key" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("host", "beyond"),
    [("127.0.0.1", False), ("127.0.0.2", False), ("::1", False), ("localhost", False), ("0.0.0.0", True),
     ("::", True), ("192.168.1.10", True), ("myhost.example.com", True)],
)  # fmt: skip
def test_only_loopback_hosts_count_as_private_binds(host: str, beyond: bool) -> None:
    assert Config(host=host).binds_beyond_loopback is beyond


def test_the_ready_line_says_when_the_server_is_reachable_from_other_machines() -> None:
    wide = ready_line(Config(host="0.0.0.0"), 8000, 1.0, "BertModel")
    assert "on http://0.0.0.0:8000 (listening beyond loopback: reachable from other machines)" in wide
    local = ready_line(Config(api_key="k"), 8000, 1.0, "BertModel")
    assert "beyond loopback" not in local
    assert local.endswith(", API key required")


def test_the_limits_table_in_the_security_doc_names_real_flags_and_their_defaults() -> None:
    table = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    rows = re.findall(r"^\| [^|]+ \| `(--[a-z-]+)` \| ([^|]+) \|", table, re.MULTILINE)
    assert len(rows) >= 8
    defaults = {action.option_strings[0]: action.default for action in build_parser()._actions if action.option_strings}
    for flag, documented in rows:
        assert flag in defaults, flag
        if defaults[flag]:  # 0 means "the model's own", which the table says in words
            assert f"{defaults[flag]:.15g}" in documented.replace(",", ""), (flag, documented)


def test_the_connection_flags_map_to_their_fields() -> None:
    config = parse_config(
        [
            "--accept-balance", "connections", "--max-requests-per-connection", "50", "--max-connection-age", "12.5",
            "--keep-alive-timeout", "9", "--header-timeout", "7", "--body-timeout", "0", "--max-connections-per-server",
            "100",
        ]
    )  # fmt: skip
    assert (config.accept_balance, config.max_requests_per_connection) == ("connections", 50)
    assert (config.max_connection_age, config.keep_alive_timeout) == (12.5, 9.0)
    assert (config.header_timeout, config.body_timeout, config.max_connections_per_server) == (7.0, 0.0, 100)
    defaults = parse_config([])
    assert defaults.accept_balance == "both" == Config().accept_balance
    assert defaults.max_requests_per_connection == Config().max_requests_per_connection
    assert defaults.max_connection_age == Config().max_connection_age
    assert defaults.keep_alive_timeout == Config().keep_alive_timeout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--accept-balance", "random"], "invalid choice: 'random'"),
        (["--max-requests-per-connection", "-1"], "--max-requests-per-connection has value -1"),
        (["--max-connection-age", "-1"], "--max-connection-age has value -1.0"),
        (["--keep-alive-timeout", "0"], "--keep-alive-timeout has value 0.0"),
        (["--header-timeout", "-1"], "--header-timeout has value -1.0"),
        (["--body-timeout", "-1"], "--body-timeout has value -1.0"),
        (["--max-connections-per-server", "0"], "--max-connections-per-server has value 0"),
        (["--max-connections-per-server", "100000000"], "--max-connections-per-server has value 100000000, but"),
    ],
)
def test_bad_connection_flags_fail_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_every_config_field_is_exactly_one_flag_with_the_field_s_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (API_KEY_ENV, *OTEL_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    flags = {action.dest: action.option_strings for action in build_parser()._actions if action.dest != "help"}
    fields = msgspec.structs.fields(Config)
    assert sorted(flags) == sorted(field.name for field in fields)
    # The field's name with dashes; a repeated list flag takes the singular its Flag names.
    renamed = {"plugins": ["--plugin"]}
    for field in fields:
        assert flags[field.name] == renamed.get(field.name, ["--" + field.name.replace("_", "-")])
    defaults = {action.dest: action.default for action in build_parser()._actions}
    for field in fields:
        expected = field.default if field.default_factory is msgspec.NODEFAULT else field.default_factory()
        if field.name in FROM_ENVIRONMENT:  # read from the environment after parsing (the key stays out of --help)
            assert defaults[field.name] is argparse.SUPPRESS
        elif field.name == "model":  # repeatable: the list of values given, none by default
            assert defaults[field.name] is None
        else:
            assert defaults[field.name] == expected, field.name
    assert parse_config([]) == Config()


def test_a_literal_field_s_values_are_the_flag_s_choices() -> None:
    choices = {action.dest: action.choices for action in build_parser()._actions if action.choices}
    assert choices == {
        "pooling": ("auto", "mean", "cls", "last"),
        "score_format": ("none", "mxbai-rerank-v2", "bge-reranker-v2-gemma"),
        "accept_balance": ("connections", "requests", "both", "none"),
        "long_input": ("refuse", "truncate", "chunk"),
        "dtype": ("auto", "float32", "float16", "bfloat16", "int8"),
        "token_packing": ("auto", "on", "off"),
        "runtime": ("auto", "torch", "onnxruntime", "hybrid"),
        "log_level": ("debug", "info", "warning", "error"),
        "log_format": ("text", "json"),
        "trace_sampler": (
            "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio",
            "always_on", "always_off", "traceidratio",
        ),
    }  # fmt: skip


def test_tracing_is_off_by_default_and_takes_opentelemetrys_variables_unless_a_flag_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    config = parse_config([])
    assert (config.otlp_endpoint, config.otlp_service_name) == ("", "poolserve")
    assert (config.trace_sampler, config.trace_sampler_arg) == ("parentbased_always_on", 1.0)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "embedder")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    config = parse_config([])
    assert (config.otlp_endpoint, config.otlp_service_name) == ("http://collector:4318", "embedder")
    assert (config.trace_sampler, config.trace_sampler_arg) == ("parentbased_traceidratio", 0.25)
    config = parse_config(["--otlp-endpoint", "https://other:4318/v1/traces", "--trace-sampler-arg", "0.5"])
    assert (config.otlp_endpoint, config.trace_sampler_arg) == ("https://other:4318/v1/traces", 0.5)
    # OpenTelemetry reads an empty variable as an unset one.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    assert parse_config([]).otlp_endpoint == ""


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("OTEL_TRACES_SAMPLER", "jaeger_remote", "OTEL_TRACES_SAMPLER has value 'jaeger_remote'"),
        ("OTEL_TRACES_SAMPLER_ARG", "half", "OTEL_TRACES_SAMPLER_ARG has value 'half'"),
        ("OTEL_TRACES_SAMPLER_ARG", "2", "--trace-sampler-arg has value 2.0"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318", "--otlp-endpoint has value 'collector:4318'"),
        ("OTEL_SERVICE_NAME", " ", "--otlp-service-name is empty"),
    ],
)
def test_a_tracing_setting_that_cannot_work_is_refused_naming_it(
    variable: str,
    value: str,
    named: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit):
        parse_config([])
    assert named in capsys.readouterr().err
