"""Declaring several models: repeated --model NAME=PATH or a --config TOML file, each model its own Config, and the
supervisor's engines numbered across the models (poolserve/served_models.py, poolserve/boot.py's EngineLayout)."""

from __future__ import annotations

from pathlib import Path

import pytest

from poolserve.boot import ChildSpec, EngineLayout, child_name
from poolserve.config import BUNDLED_MODEL_NAME, Config
from supervisor.arbiter import Supervisor, ready_line
from supervisor.cli import parse_config, parse_configs


def test_one_model_reads_as_it_always_did(tmp_path: Path) -> None:
    assert parse_configs([]) == [Config()]
    assert parse_configs(["--model", "/models/bge", "--served-model-name", "a", "b"]) == [
        Config(model="/models/bge", served_model_name=["a", "b"])
    ]
    odd = tmp_path / "a=b"  # a folder that exists is a path, '=' or not
    odd.mkdir()
    assert parse_config(["--model", str(odd)]).model == str(odd)


def test_repeated_model_flags_declare_several_models_sharing_the_other_flags() -> None:
    embedder, reranker, bundled = parse_configs(
        ["--model", "embed=/m/bge", "--model", "rank=/m/ce", "--model", "", "--dtype", "float32", "--port", "9000"]
    )
    assert (embedder.model, embedder.model_names) == ("/m/bge", ["embed"])
    assert (reranker.model, reranker.model_names) == ("/m/ce", ["rank"])
    assert bundled.is_bundled_model and bundled.model_names == [BUNDLED_MODEL_NAME]
    assert {config.dtype for config in (embedder, reranker, bundled)} == {"float32"}
    assert {config.port for config in (embedder, reranker, bundled)} == {9000}


def test_a_config_file_gives_each_model_its_own_engine_options(tmp_path: Path) -> None:
    file = tmp_path / "models.toml"
    file.write_text(
        '[[models]]\nserved_model_name = ["minilm", "default"]\ndtype = "float32"\n\n'
        '[[models]]\nmodel = "/m/ce"\nserved_model_name = ["rank"]\nengine_count = 2\nmax_batch_size = 64\n'
        'max_batch_tokens = 4096\ndevice = "cuda:1,2"\n'
    )
    minilm, rank = parse_configs(["--config", str(file), "--api-server-count", "3", "--max-batch-size", "16"])
    assert (minilm.is_bundled_model, minilm.model_names, minilm.dtype) == (True, ["minilm", "default"], "float32")
    assert (minilm.engine_count, minilm.max_batch_size) == (1, 16)  # the command line's, where the table is silent
    assert (rank.model, rank.engine_count, rank.max_batch_size, rank.max_batch_tokens) == ("/m/ce", 2, 64, 4096)
    assert rank.dtype == "auto" and {minilm.api_server_count, rank.api_server_count} == {3}
    assert (minilm.device, rank.device_kind, rank.gpu_indexes) == ("auto", "cuda", [1, 2])


def test_each_model_has_its_own_admission_limits_cache_and_priority_settings(tmp_path: Path) -> None:
    """A [[models]] table overrides the command line's queue limits, cache and priority settings for its model
    alone: each engine builds its admission limit, cache and priority policy from its own model's Config."""
    file = tmp_path / "models.toml"
    file.write_text(
        '[[models]]\nserved_model_name = ["minilm"]\ncache_bytes = 1048576\n\n'
        '[[models]]\nmodel = "/m/ce"\nserved_model_name = ["rank"]\nmax_queued_inputs = 16\n'
        "max_queued_tokens = 2048\nmin_priority = -5\npriority_max_wait = 2.5\n"
    )
    minilm, rank = parse_configs(["--config", str(file), "--max-queued-inputs", "512", "--min-priority", "0"])
    assert (minilm.cache_bytes, minilm.max_queued_inputs, minilm.max_queued_tokens) == (1 << 20, 512, 262_144)
    assert (minilm.min_priority, minilm.priority_max_wait) == (0, 10.0)
    assert (rank.cache_bytes, rank.max_queued_inputs, rank.max_queued_tokens) == (0, 16, 2048)
    assert (rank.min_priority, rank.priority_max_wait) == (-5, 2.5)


@pytest.mark.parametrize(
    ("argv", "toml", "message"),
    [
        (["--model", "a=/x", "--model", "a=/y"], None, "models 1 and 2 are both named 'a'"),
        (["--model", "/x", "--model", "/y", "--served-model-name", "n"], None, "--served-model-name names the one"),
        (["--model", "=/x"], None, "the name before '=' is empty"),
        (["--model", "a=/x"], "[[models]]\nmodel = '/y'\n", "--model and --config both declare models"),
        ([], "[[models]]\nmodel = '/y'\nport = 80\n", "'port' is not a per-model setting"),
        ([], "[[models]]\nengine_count = 'two'\n", "Expected `int`, got `str`"),
        ([], "[[models]]\nengine_count = 0\n", "--engine-count has value 0"),
        (
            ["--model", "a=/x", "--model", "b=/y", "--default-model", "c"],
            None,
            "--default-model has value 'c', which names no model served; the names are 'a', 'b'.",
        ),
        ([], "[[models]]\ndefault_model = 'a'\n", "'default_model' is not a per-model setting"),
        ([], "[[models]]\ndevice = 'gpu1'\n", "--device has value 'gpu1'; give auto, cpu, cuda, or cuda:I[,J...]"),
        ([], "models = 3\n", "give at least one [[models]] table"),
        ([], "[server]\nport = 1\n", "unknown key 'server'"),
        ([], "[[models]\n", "not valid TOML"),
    ],
)
def test_a_bad_declaration_fails_with_one_sentence(
    argv: list[str], toml: str | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if toml is not None:
        file = tmp_path / "models.toml"
        file.write_text(toml)
        argv = [*argv, "--config", str(file)]
    with pytest.raises(SystemExit):
        parse_configs(argv)
    assert message in capsys.readouterr().err


def test_default_model_picks_the_default_by_any_of_its_names_and_puts_it_first(tmp_path: Path) -> None:
    """Every process takes the first model as the default (requests naming none, TEI's routes): --default-model
    moves the one it names there, the others keep their order."""
    embed, rank, clip = parse_configs(
        ["--model", "embed=/m/bge", "--model", "rank=/m/ce", "--model", "clip=/m/clip", "--default-model", "rank"]
    )
    assert [config.model_names for config in (embed, rank, clip)] == [["rank"], ["embed"], ["clip"]]
    file = tmp_path / "models.toml"
    file.write_text('[[models]]\n\n[[models]]\nmodel = "/m/ce"\nserved_model_name = ["rank", "reranker"]\n')
    first, second = parse_configs(["--config", str(file), "--default-model", "reranker"])
    assert (first.model, second.is_bundled_model) == ("/m/ce", True)
    assert parse_configs(["--config", str(file)])[0].is_bundled_model  # none named: the first table
    assert parse_configs(["--model", "/m/bge", "--default-model", "/m/bge"]) == [
        Config(model="/m/bge", default_model="/m/bge")
    ]


def test_engines_are_numbered_across_the_models_so_names_and_sockets_stay_apart() -> None:
    layout = EngineLayout([2, 1])
    assert [layout.model_of(index) for index in range(3)] == [0, 0, 1]
    assert [layout.local_index(index) for index in range(3)] == [0, 1, 0]
    embedder, reranker = parse_configs(["--model", "a=/x", "--model", "b=/y"])
    spec = ChildSpec(
        role="api", config=embedder, runtime_dir="/run/p", boot_fd=3, supervisor_pid=1,
        models=[embedder, reranker], engine_counts=[2, 1],
    )  # fmt: skip
    assert spec.engine_endpoints_of(0) == ["ipc:///run/p/engine-0.sock", "ipc:///run/p/engine-1.sock"]
    assert spec.engine_endpoints_of(1) == ["ipc:///run/p/engine-2.sock"]
    supervisor = Supervisor(embedder, [embedder, reranker])
    assert supervisor.engine_slots == {"engine-0": 0, "engine-1": 1}
    assert child_name("engine", 0, 1) == "engine"  # one model of one engine keeps its name


def test_the_ready_line_names_every_model_and_the_default() -> None:
    embedder, reranker = parse_configs(["--model", "a=/x", "--model", "b=/y", "--api-server-count", "1"])
    line = ready_line(embedder, 8000, 1.0, "BertModel (embedding)", [(reranker, "BertForSequenceClassification")])
    assert "model a (the default: BertModel (embedding)), model b (BertForSequenceClassification), 1 API" in line
    assert ready_line(Config(engine_count=2, api_server_count=1), 8000, 1.0, "BertModel").endswith(
        "1 API server(s), 2 engines"
    )
