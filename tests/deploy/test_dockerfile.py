"""The Dockerfile installs what `make install` installs, the same way, and starts `launch` as a non-root user."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

from supervisor.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
MAKEFILE = ROOT / "Makefile"
DEPLOYMENT = ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml"
# Options that say where pip looks or what it keeps, not what it installs.
PLACE_OPTIONS = {"--no-cache-dir", "--index-url"}


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def make_install_recipe() -> list[str]:
    """The commands of the Makefile's install target (its stamp file's recipe)."""
    recipe = re.search(r"^\$\(STAMP\):.*\n((?:\t.*\n)+)", MAKEFILE.read_text(), re.MULTILINE)
    assert recipe, "the Makefile's install recipe moved"
    return [line.strip() for line in recipe[1].splitlines()]


def pip_installs(commands: list[str]) -> list[list[str]]:
    """What each `pip install` installs, with its options, in order: the variable that holds the torch
    pin is named by its name, the package by `.` (editable or not, whatever extras)."""
    installs = []
    for command in commands:
        for part in command.split("&&"):
            words = shlex.split(part)
            if "pip" not in words or "install" not in words:
                continue
            words = words[words.index("install") + 1 :]
            kept: list[str] = []
            skip_value = False
            for word in words:
                if skip_value:
                    skip_value = False
                elif word in PLACE_OPTIONS:
                    skip_value = word == "--index-url"
                elif word == "-e":
                    continue
                else:
                    named = re.sub(r"^\$[({](\w+)[)}]$", r"\1", word)
                    kept.append("." if re.fullmatch(r"\.(\[[\w,]+\])?", named) else named)
            installs.append(kept)
    return installs


def arg_default(name: str) -> str:
    (value,) = [
        args.split("=", 1)[1]
        for kind, args in dockerfile_instructions()
        if kind == "ARG" and args.startswith(name + "=")
    ]
    return value


def test_the_dockerfile_pins_the_makefiles_torch() -> None:
    pin = re.search(r"^TORCH_SPEC \?= (\S+)$", MAKEFILE.read_text(), re.MULTILINE)
    assert pin
    assert arg_default("TORCH_SPEC") == pin[1]


def test_the_dockerfile_installs_what_make_install_does_in_the_same_order() -> None:
    runs = [args for kind, args in dockerfile_instructions() if kind == "RUN"]
    expected = [["--quiet", "--upgrade", "pip"], ["--quiet", "TORCH_SPEC"], ["--quiet", "."]]
    # The checkout's install adds what only the tests read: the dev extras, and bge-m3's reference (FlagEmbedding,
    # without its dependencies); the image serves, it does not test.
    test_references = [["--quiet", "--no-deps", "FLAGEMBEDDING_SPEC"]]
    assert pip_installs(make_install_recipe()) == expected + test_references
    assert pip_installs(runs) == expected


def test_the_install_comparison_sees_a_different_command() -> None:
    assert pip_installs(['$(BIN)/python -m pip install --quiet "torch==2.0"']) == [["--quiet", "torch==2.0"]]
    assert pip_installs(["pip install --quiet --index-url https://x ${TORCH_SPEC} numpy"]) == [
        ["--quiet", "TORCH_SPEC", "numpy"]
    ]


def test_the_cpu_build_is_the_default_and_cuda_a_build_argument() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0] == ("ARG", "BASE_IMAGE=python:3.11-slim")
    assert ("FROM", "${BASE_IMAGE}") in instructions
    assert arg_default("TORCH_INDEX_URL").endswith("/whl/cpu")
    assert "BASE_IMAGE=nvidia/cuda:" in DOCKERFILE.read_text()


def test_the_image_runs_launch_as_the_deployments_non_root_user() -> None:
    instructions = dict(reversed(dockerfile_instructions()))  # the first of each kind
    user = [args for kind, args in dockerfile_instructions() if kind == "USER"][-1]
    uid, _, gid = user.partition(":")
    (deployment,) = [doc for doc in yaml.safe_load_all(DEPLOYMENT.read_text()) if doc]
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert (int(uid), int(gid)) == (pod_security["runAsUser"], pod_security["runAsGroup"]) != (0, 0)
    assert json.loads(instructions["ENTRYPOINT"]) == ["launch"]
    args = json.loads(instructions["CMD"])
    options = {option for action in build_parser()._actions for option in action.option_strings}
    assert {arg for arg in args if arg.startswith("--")} <= options
    assert build_parser().parse_args(args).host == "0.0.0.0"
    exposed = int(instructions["EXPOSE"])
    assert (
        exposed
        == int(args[args.index("--port") + 1])
        == deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    )


def test_the_image_copies_every_package_pyproject_ships() -> None:
    include = re.search(r"^include = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert include
    packages = re.findall(r'"(\w+)\*"', include[1])
    copies = [args for kind, args in dockerfile_instructions() if kind == "COPY"]
    assert [f"{package} ./{package}" for package in packages] == [copy for copy in copies if copy.split()[-1] != "./"]
