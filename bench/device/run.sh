#!/usr/bin/env bash
# There, on the lent GPU machine (python3 3.12 with torch and CUDA), after bench/device/prepare.sh here:
#   run(command="bash bench/device/run.sh STAGE", carry=[".device"])
# STAGE: tests   the CUDA tests and the end-to-end embeddings test with --device cuda (issue 11)
#        offline the offline ceiling on the GPU, float16 and float32, batch sweep, workloads a, b, c
#        serve   bench.sweep on the GPU: workloads a, b (c with `serve c`), 1/2/4/8 API servers,
#                64/128/256 clients, /health probed throughout; the load generator on the same machine
# Each stage fits one call (under 10 minutes); results land in $OUT (fetched back) as JSON and logs.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT" /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device/wheels/*.whl
python3 bench/device/model_carry.py unpack .device/model /tmp/site
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/gpu.txt"
stage=${1:-tests}
case "$stage" in
tests)
  python3 -m pytest -q -p no:cacheprovider -rs tests/engine_core/test_cuda.py tests/engine_core/test_pixels.py \
    tests/e2e/test_embeddings.py 2>&1 | tee "$OUT/tests.log"
  ;;
offline)
  for workload in a b c; do
    for dtype in float16 float32; do
      python3 -m bench.offline --workload "$workload" --device cuda --dtype "$dtype" \
        --batch-sizes 1,8,32,64,128,256,512 --seconds 2 --threads 4 --out "$OUT/offline-$workload-$dtype.json" \
        2>>"$OUT/offline.log" >/dev/null
      python3 - "$OUT/offline-$workload-$dtype.json" <<'PYTHON'
import json, sys
r = json.load(open(sys.argv[1]))
b = r["best"]
print(f"{r['workload']:8s} {r['dtype']:8s} best {b['items_per_s']:9.1f} items/s at batch {b['batch_size']} ({b['order']}), 1-input p50 {r['single_latency_ms']['p50']:.2f} ms, frontend {r['frontend_per_s_one_thread']:.0f}/s per core")
PYTHON
    done
  done
  ;;
serve)
  workloads=${2:-a,b}
  python3 -m bench.sweep --workloads "$workloads" --api-servers 1,2,4,8 --preprocess-workers 1 \
    --concurrency 64,128,256 --duration 8 --warmup 2 --steps serve --peers none --max-minutes 9 \
    --server-args "--device cuda" --label "gpu-${workloads//,/}" 2>&1 | tail -60 | tee "$OUT/serve.log"
  cp bench/results/*gpu-* "$OUT/" 2>/dev/null || true
  ;;
*)
  echo "unknown stage $stage (tests, offline, serve)" >&2
  exit 2
  ;;
esac
