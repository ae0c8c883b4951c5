"""Infinity's ONNX Runtime engine as a CPU peer (issue 33): the bundled model exported once, quantised once, each
variant served from its own copy of the model folder.

    make bench-onnx-peer          # two venvs: the exporter's and the peer's (below)
    python -m bench.onnx_peer     # prepare the folders, start each variant, check its vectors, stop it

Why two venvs and these pins (found the hard way, issue 33): Infinity 0.0.78's `--engine optimum` needs
optimum 1.24 (1.25 to 2.x are handed the ONNX file's absolute path and fail with a local folder; 1.27 wants
transformers >= 4.49, which Infinity's import of optimum.bettertransformer refuses), with transformers < 4.49,
numpy < 2, sentence-transformers 3.4.1 and pyarrow < 21 beside it. optimum 1.24's exporter fails on torch 2.13, so
`model.onnx` comes from optimum-onnx in a venv of its own (opset 18), and its int8 twin from the same venv's
`optimum-cli onnxruntime quantize` (per channel, for this CPU's instructions).

Each variant gets its own folder because Infinity prefers any file with "quantize" in its name on a CPU, and
writes its optimised graph into a cache keyed by the folder's path (here under the work folder's `hf/`, not the
user's cache). `--pooling-method mean` is required: its default for ONNX models is the CLS token, and the vectors
are then wrong (cos 0.37-0.49 against sentence-transformers).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import httpx
import numpy as np

from bench.harness.corpus import make_sentences
from bench.harness.models import bundled_model_folder
from bench.harness.server_process import REPO, ServerProcess, start_infinity

EXPORT_VENV = REPO / "bench" / ".onnx-export-venv"
PEER_VENV = REPO / "bench" / ".onnx-peer-venv"
WORK = REPO / "bench" / ".models" / "onnx"
# What Infinity finds in each variant's folder: fp32 reads model.onnx; int8 the quantised file, preferred on a CPU.
VARIANT_FILES = {"fp32": "model.onnx", "int8": "model_quantized.onnx"}


def missing() -> str:
    """Why the peer cannot run here, or "" when it can."""
    for venv, program in ((EXPORT_VENV, "optimum-cli"), (PEER_VENV, "infinity_emb")):
        if not (venv / "bin" / program).is_file():
            return f"{venv / 'bin' / program} not found; run `make bench-onnx-peer`"
    return ""


def quantize_target() -> str:
    """optimum's quantisation preset for this CPU: VNNI where it has it, else AVX2."""
    flags = Path("/proc/cpuinfo").read_text()
    return "--avx512_vnni" if "avx512_vnni" in flags else "--avx2"


def prepare(model_folder: Path, work: Path = WORK) -> dict[str, Path]:
    """The variants' folders (exported and quantised once, reused after): {"fp32": folder, "int8": folder}."""
    exported, quantised = work / "export", work / "int8-export"
    cli = str(EXPORT_VENV / "bin" / "optimum-cli")
    if not (exported / "model.onnx").is_file():
        subprocess.run(
            [cli, "export", "onnx", "--model", str(model_folder), "--task", "feature-extraction", "--opset", "18",
             str(exported)],
            check=True, capture_output=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    if not (quantised / VARIANT_FILES["int8"]).is_file():
        subprocess.run(
            [cli, "onnxruntime", "quantize", "--onnx_model", str(exported), quantize_target(), "--per_channel",
             "-o", str(quantised)],
            check=True, capture_output=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    folders = {}
    for variant, name in VARIANT_FILES.items():
        folder = work / variant
        source = (exported if variant == "fp32" else quantised) / name
        if not (folder / name).is_file():
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(model_folder, folder)
            shutil.copy2(source, folder / name)
        folders[variant] = folder
    return folders


def start(folder: Path, served_name: str, *, batch_size: int = 32, work: Path = WORK) -> ServerProcess:
    """Infinity's optimum engine on `folder`, mean pooling, its optimised-graph cache in the work folder."""
    return start_infinity(
        PEER_VENV / "bin" / "infinity_emb", folder, served_name, batch_size=batch_size, engine="optimum",
        extra=["--pooling-method", "mean"], env={"HF_HOME": str(work / "hf")},
    )  # fmt: skip


def vectors(url: str, path: str, served_name: str, texts: list[str]) -> np.ndarray:
    """The server's vectors for `texts`, asked 16 at a time, as float32 rows."""
    rows: list[list[float]] = []
    with httpx.Client(timeout=60) as client:
        for begin in range(0, len(texts), 16):
            body = {"model": served_name, "input": texts[begin : begin + 16]}
            answer = client.post(f"{url}{path}", json=body)
            answer.raise_for_status()
            rows += [item["embedding"] for item in sorted(answer.json()["data"], key=lambda item: item["index"])]
    return np.asarray(rows, dtype=np.float32)


def cosine_min(served: np.ndarray, reference: np.ndarray) -> float:
    served = served / np.linalg.norm(served, axis=1, keepdims=True)
    reference = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    return float(np.min(np.sum(served * reference, axis=1)))


def reference_vectors(model: Path, texts: list[str]) -> np.ndarray:
    """sentence-transformers' own vectors for `texts`, float32: what every peer's are held to."""
    from sentence_transformers import SentenceTransformer

    encoded: np.ndarray = SentenceTransformer(str(model), device="cpu").encode(texts, convert_to_numpy=True)
    return encoded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=64)
    args = parser.parse_args()
    if reason := missing():
        raise SystemExit(reason)
    model = bundled_model_folder()
    texts = make_sentences(args.sentences, 0)
    reference = reference_vectors(model, texts)
    for variant, folder in prepare(model).items():
        server = start(folder, "peer")
        try:
            served = vectors(server.url, "/embeddings", "peer", texts)
            print(json.dumps({"variant": variant, "cos_min": round(cosine_min(served, reference), 5)}), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
