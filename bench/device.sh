#!/usr/bin/env bash
# The 16-core GPU machine's run of bench/bench_sparse_threads.py --part device, in one command of
# at most ten minutes: build and install gpc with the machine's own numpy, scipy, Cython and meson,
# then the bench.  Run it from the repository root:
#
#     bash bench/device.sh              # the preset (about five minutes after the build)
#     bash bench/device.sh --quick      # a smoke run of the same path
#
# Such a machine has no network.  The build backend and its one dependency that it lacks
# (meson-python, pyproject-metadata) travel as wheels in .whl/ when that folder exists.  The log
# and the build's output go to $OUT (default /tmp/gpc-device).
set -uo pipefail
out=${OUT:-/tmp/gpc-device}
mkdir -p "$out"
start=$(date +%s)
py=${PYTHON:-python3}

if compgen -G ".whl/*.whl" > /dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpc-device-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/gpc-device-site${PYTHONPATH:+:$PYTHONPATH}
fi

if ! "$py" -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir . \
        > "$out/build.log" 2>&1; then
    tail -n 60 "$out/build.log"
    exit 1
fi
echo "built and installed in $(( $(date +%s) - start )) s"

# Leave the source tree's python/ off the path: the bench must import the installed build.
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
PYTHONUNBUFFERED=1 "$py" bench_sparse_threads.py --part device "$@" 2>&1 | tee "$out/device.log"
status=$?
echo "device.sh: $(( $(date +%s) - start )) s in all, exit $status"
exit $status
