#!/usr/bin/env bash
# The 16-core GPU machine's run in one command of at most nine minutes: build and install gpc with
# the machine's own numpy, scipy, Cython and meson, then time to accuracy
# (bench_time_to_accuracy.py: gpc against GPyTorch's natural-gradient SVGP on every core and on
# the GPU), then bench_sparse_threads.py --part device.  Run it from the repository root:
#
#     bash bench/device.sh              # the preset (about five minutes with the build)
#     bash bench/device.sh --quick      # a smoke run of the same path, every part shrunk
#
# Each part runs under its own `timeout`, sized from what is left of DEVICE_SECONDS (default 500)
# after the parts before it, so a slow part cannot take the others' time; each part's log is
# written as it runs.  Other arguments go to bench_sparse_threads.py.  DEVICE_NO_INSTALL=1 skips
# the install and runs the gpc that $PYTHON already imports (an in-place build, for a local test).
#
# Such a machine has no network.  The build backend and its one dependency that it lacks
# (meson-python, pyproject-metadata) travel as wheels in .whl/ when that folder exists.  The logs,
# the time-to-accuracy curves (tta.json) and the build's output go to $OUT (default
# /tmp/gpc-device).
set -uo pipefail
out=${OUT:-/tmp/gpc-device}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$(date +%s)
py=${PYTHON:-python3}
budget=${DEVICE_SECONDS:-500}
quick=0
for arg in "$@"; do
    [ "$arg" = "--quick" ] && quick=1
done
export PYTHONUNBUFFERED=1

elapsed() { echo $(( $(date +%s) - start )); }
left() { echo $(( budget - $(elapsed) )); }
stamp() { echo "== $(date +%H:%M:%S), $(elapsed) s in: $*"; }
smaller() { echo $(( $1 < $2 ? $1 : $2 )); }
# part LIMIT LOG COMMAND...: COMMAND under `timeout LIMIT` (skipped below 20 s: `timeout 0` would
# never stop it), its output on the screen and in $out/LOG; returns its exit status (124: stopped)
part() {
    local limit=$1 log=$2
    shift 2
    if [ "$limit" -lt 20 ]; then
        echo "skipped: only ${limit} s left for it" | tee "$out/$log"
        return 124
    fi
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$out/$log"
    local status=${PIPESTATUS[0]}
    [ "$status" = 124 ] && echo "stopped at its ${limit} s limit" | tee -a "$out/$log"
    return "$status"
}

# 1. the build (about 60 s on 16 cores)
stamp "build and install"
if [ "${DEVICE_NO_INSTALL:-0}" = 1 ]; then
    echo "DEVICE_NO_INSTALL=1: not installing; the benches import what $py imports"
else
    if compgen -G ".whl/*.whl" > /dev/null; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/gpc-device-site .whl/*.whl || exit 1
        export PYTHONPATH=/tmp/gpc-device-site${PYTHONPATH:+:$PYTHONPATH}
    fi
    if ! timeout -k 10 "$(smaller 240 "$(left)")" "$py" -m pip install --no-build-isolation \
            --no-deps --no-index --no-cache-dir . > "$out/build.log" 2>&1; then
        tail -n 60 "$out/build.log"
        exit 1
    fi
    echo "built and installed in $(elapsed) s"
fi

# Leave the source tree's python/ off the path: the benches must import the installed build.
cd bench || exit 1
"$py" - <<'EOF'
import os, numpy, scipy, threadpoolctl, gpc
print("gpc", gpc.__version__, "from", os.path.dirname(gpc.__file__))
print("numpy", numpy.__version__, "scipy", scipy.__version__, "cores", len(os.sched_getaffinity(0)))
for lib in threadpoolctl.threadpool_info():
    print(lib["internal_api"], lib.get("version"), lib["num_threads"], "threads", lib["filepath"])
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except ImportError:
    print("no torch")
EOF

# 2. time to accuracy on every core and on the GPU: one round, 10 epochs each of gpc, GPyTorch NGD
# on the CPU (float64) and on the GPU (float64 and float32; skipped without CUDA).  About 2 minutes
# on 16 cores; it may take at most 200 s and must leave 150 s for part 3.
if [ "$quick" = 1 ]; then
    size=(--n 20000 --m 50 --epochs 2)
else
    size=(--n 200000 --m 200 --epochs 10)
fi
limit=$(smaller 200 $(( $(left) - 150 )))
stamp "time to accuracy (limit ${limit} s)"
part "$limit" tta.log "$py" bench_time_to_accuracy.py --data synthetic "${size[@]}" --batch 2000 \
    --rounds 1 --threads "$(nproc)" --systems gpc ngd ngd-cuda ngd-cuda-f32 --out "$out/tta.json"
tta=$?

# 3. the thread scaling and the one-epoch peers (about 2 minutes on 16 cores).  Its GPyTorch runs
# start only while 30 s of its time are left; below 170 s the batch of 200 rows (a third of
# the scaling's time) is left out.
limit=$(( $(left) - 10 ))
extra=(--peer-deadline $(( limit - 30 )))
[ "$quick" = 1 ] && extra+=(--n 40000)
[ "$limit" -lt 170 ] && extra+=(--batches 2000 20000)
stamp "bench_sparse_threads --part device (limit ${limit} s) ${extra[*]} $*"
part "$limit" device.log "$py" bench_sparse_threads.py --part device "${extra[@]}" "$@"
dev=$?

stamp "done: time to accuracy exit $tta, bench_sparse_threads exit $dev"
[ "$tta" = 0 ] && [ "$dev" = 0 ]
