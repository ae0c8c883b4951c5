#!/usr/bin/env bash
# There, on the lent GPU machine (python3 3.12 with torch and CUDA), after bench/device/prepare.sh here:
#   run(command="bash bench/device/run.sh STAGE [STAGE ...]", carry=[".device"])
# Stages, run in the order given (a device call is 10 minutes at most: tests+offline+peer+overhead
# fit one call, serve another):
#   tests     the CUDA tests and the end-to-end embeddings test (its CUDA server included) (issue 11)
#   offline   the offline ceiling on the GPU: float16 on workloads a, b, c, float32 on b; batch sweep
#   peer      Sentence-Transformers' own encode on the GPU (float16 and float32): the peer's figure
#   sdpa      float16's cost per new batch shape, with torch's cuDNN attention on and off (sdpa_trial.py)
#   probe     one served load (a, 256 clients, 1 and 8 API servers) and the server's own histograms
#   overhead  the engine's work around the forward pass, and padding, on the GPU (bench.engine_overhead)
#   served[=W[:N,...]] bench.variants under wrk (carried by prepare.sh), 256 clients, workload W (default a):
#             N API servers (default 1,2,4,8), then the last N with each flag set of SERVED_EXTRA (';'-separated;
#             default "--token-packing on"), one round each; throughput, p99, inputs per pass, ms per pass
#   cpu       bench.request_cpu on the GPU (float16): CPU per request of each process, one API server, wrk,
#             64 clients, one sentence and 16 sentences, beside the bare frontend's floor
#   restart   bench.engine_restart, 3 kills of the engine, --device cuda (spawned fresh) then cpu (forked from the
#             engine template): how long the model is away, the figure that decides whether CUDA engines should
#             come from the template too (docs/operations.md, "The engine template")
#   graphs    MiniLM's float16 forward eager against a CUDA graph's replay, per (batch, length), beside the runner
#             (bench/device/graphs_trial.py): what CUDA graphs would take off the launch-bound pass
#   profile[=N:C] py-spy (carried) on the engine (wall and --gil) and an API server of a `--device cuda` server with
#             N API servers under C wrk clients of (a) (bench/device/engine_profile.py; default 8:256); raw stacks in
#             $OUT/profile/, each one's top functions printed
#   serve[=W] bench.sweep on the GPU: workloads W (default a,b,c), 1/2/4/8 API servers, 64 and 256
#             clients, /health probed throughout; the load generator on the same machine
# Results land in $OUT (fetched back) as JSON and logs; a short summary of each stage is printed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT" /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .device/wheels/*.whl || exit 1
python3 bench/device/model_carry.py unpack .device/model /tmp/site || exit 1
# The tree runs from PYTHONPATH, not installed; the API server reads its version from the package's
# metadata, so give it some (the version pyproject.toml names).
python3 - <<'PYTHON' || exit 1
import pathlib, tomllib
version = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]["version"]
info = pathlib.Path(f"/tmp/site/poolserve-{version}.dist-info")
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: poolserve\nVersion: {version}\n")
PYTHON
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export PATH=$PWD/.device/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# DEADLINE (seconds from now): each stage gets what is left, so that a call ends inside its limit.
end=$((SECONDS + ${DEADLINE:-100000}))
left() { echo $((end - SECONDS > 5 ? end - SECONDS : 5)); }
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  nproc
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$OUT/gpu.txt"

offline_summary() {
  python3 - "$1" <<'PYTHON'
import json, sys
r = json.load(open(sys.argv[1]))
b = r["best"]
print(f"{r['workload']:8s} {r['dtype']:8s} best {b['items_per_s']:9.1f} items/s at batch {b['batch_size']} ({b['order']}), "
      f"1-input p50 {r['single_latency_ms']['p50']:.2f} ms, frontend {r['frontend_per_s_one_thread']:.0f}/s per core")
for shape in r["shapes"]:
    if shape.get("order") == "length-sorted":
        print(f"    batch {shape['batch_size']:4d} {shape['items_per_s']:9.1f} items/s")
PYTHON
}

status=0
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case "$stage" in
  tests)
    timeout "$(left)" python3 -m pytest -q -p no:cacheprovider -rs --timeout 120 tests/engine_core/test_cuda.py \
      tests/engine_core/test_pixels.py tests/e2e/test_embeddings.py >"$OUT/tests.log" 2>&1 || status=1
    grep -E "passed|failed|error|SKIPPED|FAILED" "$OUT/tests.log" | tail -15
    ;;
  offline)
    for run in ${OFFLINE_RUNS:-a:float16 b:float16 c:float16 b:float32}; do
      workload=${run%%:*} dtype=${run##*:}
      file="$OUT/offline-$workload-$dtype.json"
      timeout "$(left)" python3 -m bench.offline --workload "$workload" --device cuda --dtype "$dtype" \
        --batch-sizes "${OFFLINE_BATCHES:-1,8,32,64,128,256,512}" --seconds 2 --threads 4 --out "$file" \
        2>>"$OUT/offline.log" >/dev/null && offline_summary "$file" || status=1
    done
    ;;
  peer)
    for dtype in float16 float32; do
      python3 -m bench.st_offline --device cuda --dtype "$dtype" --batch-sizes 32,128,256,512 --seconds 3 \
        --out "$OUT/st-$dtype.json" 2>>"$OUT/peer.log" | python3 -c "
import json, sys; r = json.load(sys.stdin)
print('sentence-transformers', r['dtype'], ' '.join(f\"b{x['batch_size']}={x['sentences_per_s']:.0f}/s\" for x in r['runs']))" \
        || status=1
    done
    ;;
  sdpa)
    for setting in default no-cudnn-attention; do
      python3 bench/device/sdpa_trial.py "$setting" 2>>"$OUT/sdpa.log" | tee -a "$OUT/sdpa.jsonl" || status=1
    done
    ;;
  probe)
    for servers in 1 8; do
      echo "--- $servers API servers, 256 clients, (a)"
      python3 bench/device/probe.py "$servers" 256 a 2>>"$OUT/probe.log" | tee -a "$OUT/probe.txt" |
        grep -E "^\{|queue_duration|batch_inputs|forward_duration|preprocess|loop_lag|request_duration.*embeddings"
    done
    ;;
  overhead)
    python3 -m bench.engine_overhead --device cuda --sentences 2048 --per-request 16 --rounds 3 \
      >"$OUT/overhead.json" 2>>"$OUT/overhead.log" || status=1
    tail -c 1500 "$OUT/overhead.json"
    ;;
  served | served=*)
    spec=a:1,2,4,8
    [[ $stage == served=* ]] && spec=${stage#served=}
    workload=${spec%%:*} counts=1,2,4,8
    [[ $spec == *:* ]] && counts=${spec#*:}
    cuda="--device cuda --dtype float16"
    variants=()
    for n in ${counts//,/ }; do variants+=(--variant "$cuda --api-server-count $n"); done
    IFS=';' read -ra extras <<<"${SERVED_EXTRA---token-packing on}"
    for extra in "${extras[@]}"; do variants+=(--variant "$cuda --api-server-count ${counts##*,} $extra"); done
    timeout "$(left)" python3 -m bench.variants --generator wrk_load --clients 256 --workload "$workload" \
      --seconds 6 --rounds 1 "${variants[@]}" --out "$OUT/served-$workload.json" 2>>"$OUT/served.log" |
      tee -a "$OUT/served.jsonl" || status=1
    ;;
  cpu)
    timeout "$(left)" python3 -m bench.request_cpu --model bundled --generator wrk_load --clients 64 --seconds 6 \
      --workloads short,batch16 --server-flags "--device cuda --dtype float16" --out "$OUT/request-cpu.json" \
      2>>"$OUT/cpu.log" | tee -a "$OUT/request-cpu.jsonl" || status=1
    ;;
  restart)
    for device in cuda cpu; do
      timeout "$(left)" python3 -m bench.engine_restart --kills 3 --out "$OUT/restart-$device.json" -- --device "$device" \
        >/dev/null 2>>"$OUT/restart.log" || status=1
      python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], 'median ready_s', r['median_ready_s'], [(k['ready_s'], k['forked']) for k in r['kills']])" \
        "$OUT/restart-$device.json" "$device" 2>/dev/null
    done
    ;;
  graphs)
    timeout "$(left)" python3 bench/device/graphs_trial.py 2>>"$OUT/graphs.log" | tee -a "$OUT/graphs.jsonl" || status=1
    ;;
  profile | profile=*)
    spec=8:256
    [[ $stage == profile=* ]] && spec=${stage#profile=}
    timeout "$(left)" python3 bench/device/engine_profile.py "$OUT/profile" --device cuda --api-servers "${spec%%:*}" \
      --clients "${spec##*:}" 2>>"$OUT/profile.log" || status=1
    ;;
  serve | serve=*)
    workloads=a,b,c
    [[ $stage == serve=* ]] && workloads=${stage#serve=}
    label="gpu-${workloads//,/}"
    python3 -m bench.sweep --workloads "$workloads" --api-servers 1,2,4,8 --preprocess-workers 1 \
      --concurrency 64,256 --duration 6 --warmup 2 --steps serve --peers none --max-minutes "${SERVE_MINUTES:-8}" \
      --server-args "--device cuda" --label "$label" >"$OUT/serve.log" 2>&1 || status=1
    grep -E "^\| [0-9] API|^### Served|notes \|$|^results" "$OUT/serve.log" | tail -40
    cp bench/results/*"$label".* "$OUT/" 2>/dev/null
    ;;
  *)
    echo "unknown stage $stage (tests, offline, peer, sdpa, probe, overhead, served[=W], cpu, serve[=W])" >&2
    status=2
    ;;
  esac
done
echo "=== done $(date +%T)"
exit $status
