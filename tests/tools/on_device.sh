#!/bin/bash
# One call on a machine with an NVIDIA GPU (a lent device, or your own): install convgen from this
# checkout without the network, set it up, run the tests that need the device, and time convgen's
# GPU kernels against torch's (cuDNN) with `convgen bench --target cuda`. Each stage has its own
# time limit and log (under $OUT, default /tmp/convgen-device); the tail of each is printed.
#
#   tests/tools/on_device.sh [stage ...]   # stages: info install setup tests_a bench_a tests_b bench_b bench_c bench_d bench_e,
#                                          # tests_k (K=pytest -k expression), debug (DEBUG=expression),
#                                          # kernels (each pass's kernels by device time, SUITE= default weak)
#
# tests_a: the arch that serves the device (sm_90a on a Hopper part), f32 and bf16, every CASES.md variant;
# tests_b: f64, f16, and bf16/f16 again on sm_90's mma.sync kernels (CONVGEN_GPU_ARCH), and
# the generic tier; bench_a/b: the standard and weak suites in bf16 channels-last on the arch that
# serves the device and on sm_90; bench_c: f32 (tf32, torch's default) NCHW; bench_d/e: bench_a/b at --batch $BATCH
# (default 64), where the kernels bound the samples (at the suites' batch 8 an H200 outruns the host).
# Measured on an H200 (2026-12-04): setup about 55 s; tests_a needs about 200 s and tests_b about 150 s
# on its 16 cores (most of it nvcc); each bench stage at batch 8 about 35 s, at batch 64 about 45 s; kernels
# (the standard and weak suites) about 20 s. Without stages: info install setup tests_a bench_d tests_b
# bench_e kernels (give LIMIT_* to fit the device time left).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/convgen-device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CONVGEN_CACHE_DIR=/tmp/convgen-device-cache CONVGEN_GENERIC_DIR=/tmp/convgen-device-generic
export CONVGEN_TEST_CACHE_DIR=$CONVGEN_CACHE_DIR
mkdir -p "$CONVGEN_CACHE_DIR"
chmod 700 "$CONVGEN_CACHE_DIR"
PY=${PYTHON:-python3}
CG="$PY -m convgen"
STAGES=${*:-info install setup tests_a bench_d tests_b bench_e kernels}

stage() {   # stage NAME LIMIT_S COMMAND...: run it, log to $OUT/NAME.log, print its rc, time and tail
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    echo "=== $name: rc $rc, $(($(date +%s) - start)) s (limit $limit)"
    tail -n "${TAIL:-12}" "$OUT/$name.log" | cut -c1-400
}

for s in $STAGES; do
    case $s in
    info)
        { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
          $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn',
torch.backends.cudnn.version(), torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
          command -v nvcc && nvcc --version | tail -2; nproc; } >"$OUT/info.log" 2>&1
        cat "$OUT/info.log" ;;
    install)   # no network there: no build isolation, no dependencies (the image has them)
        stage install 120 $PY -m pip install -q --no-deps --no-build-isolation --no-index -e . ;;
    setup)   # in the background: only the generic tier's tests (tests_b) need it, and they wait for it
        stage setup 150 $CG setup &
        SETUP=$! ;;
    tests_a)
        stage tests_a "${LIMIT_A:-150}" $PY -m pytest -v -p no:cacheprovider tests/gpu/test_device.py \
            -k "not on_sm_90 and not -f64- and not -f16- and not generic_tier" ;;
    tests_b)
        [ -n "${SETUP:-}" ] && wait "$SETUP"
        stage tests_b "${LIMIT_B:-120}" $PY -m pytest -v -p no:cacheprovider tests/gpu/test_device.py \
            -k "on_sm_90 or -f64- or -f16- or generic_tier" ;;
    tests_k)   # the device's tests that -k "$K" selects
        stage tests_k "${LIMIT_K:-120}" $PY -m pytest -v -p no:cacheprovider tests/gpu/test_device.py -k "$K" ;;
    debug)     # the tests that -k "$DEBUG" selects, in one process, twice (a result that moves is a race)
        stage debug "${LIMIT_DEBUG:-60}" bash -c "for i in 1 2; do $PY -m pytest -n 0 -v --tb=long -p no:cacheprovider \
            tests/gpu/test_device.py -k '$DEBUG'; done" ;;
    bench_a)
        stage bench_a "${LIMIT_BENCH:-90}" $CG bench --suite all --target cuda --dtype bf16 --layout channels_last \
            --repeat 5 --min-time 0.03 ;;
    bench_b)
        stage bench_b "${LIMIT_BENCH:-90}" $CG bench --suite all --target cuda-sm_90 --dtype bf16 \
            --layout channels_last --repeat 5 --min-time 0.03 ;;
    bench_c)
        stage bench_c "${LIMIT_BENCH:-90}" $CG bench --suite all --target cuda --dtype f32 --repeat 5 --min-time 0.03 ;;
    bench_d)   # batch 64: the kernels, not the hosts' cost of a call, bound most samples there
        stage bench_d "${LIMIT_BENCH:-90}" $CG bench --suite all --target cuda --dtype bf16 --layout channels_last \
            --batch "${BATCH:-64}" --repeat 5 --min-time 0.03 ;;
    bench_e)
        stage bench_e "${LIMIT_BENCH:-90}" $CG bench --suite all --target cuda-sm_90 --dtype bf16 \
            --layout channels_last --batch "${BATCH:-64}" --repeat 5 --min-time 0.03 ;;
    kernels)   # each pass's kernels, convgen's beside torch's, by device time (tests/tools/device_kernels.py)
        stage kernels "${LIMIT_KERNELS:-120}" $PY tests/tools/device_kernels.py --suite "${SUITE:-weak}" \
            --batch "${BATCH:-64}" ;;
    *)
        echo "unknown stage $s" ;;
    esac
done
wait
grep -h "FAILED\|Error\|error:" "$OUT"/tests_*.log 2>/dev/null | sort | uniq -c | sort -rn | head -40 >"$OUT/failures.txt"
echo "=== failures (first lines; all in $OUT/failures.txt):"
head -n 25 "$OUT/failures.txt" | cut -c1-300
