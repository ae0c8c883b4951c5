#!/usr/bin/env bash
# Here, on the machine without a GPU: gathers into .device/ what the lent GPU machine lacks (it has
# torch with CUDA, transformers, tokenizers, numpy, pillow, httpx, uvloop, prometheus-client,
# sentence-transformers, pytest; it reaches no registry), within the 64 MiB a call may carry:
# wheels for Python 3.12 at the versions this project's .venv holds, and the bundled model with its
# weights in float16 (the float32 file alone is 87 MB; bench/device/run.sh widens them back there).
# Then each device call names ".device" in `carry` and runs `bash bench/device/run.sh STAGE`.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
exclude="$(git rev-parse --git-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.device/' "$exclude" 2>/dev/null || echo '/.device/' >>"$exclude"
rm -rf .device && mkdir -p .device/wheels
packages="py-spy uvicorn starlette pyzmq msgspec orjson httptools websockets watchfiles python-dotenv openai distro jiter
  pydantic pydantic-core annotated-types typing-inspection sniffio httpx2 httpcore2 truststore typing-extensions anyio
  setproctitle"
pins=$($PY - $packages <<'PYTHON'
import importlib.metadata, sys

def pin(name):
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:  # not needed here, maybe there: the newest
        return name

print(" ".join(map(pin, sys.argv[1:])))
PYTHON
)
# shellcheck disable=SC2086
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
  --platform manylinux1_x86_64 \
  -d .device/wheels $pins
$PY bench/device/model_carry.py pack .device/model
# Debian's wrk, the native load generator (bench/wrk_load.py), and the LuaJIT it links (the machine has libssl).
if command -v wrk >/dev/null; then
  mkdir -p .device/bin .device/lib
  cp "$(command -v wrk)" .device/bin/
  cp -L "$(ldd "$(command -v wrk)" | awk '/libluajit/ {print $3}')" .device/lib/
fi
du -sh .device
