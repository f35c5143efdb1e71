#!/usr/bin/env bash
# Record the GPU of this machine into a profile bundle, in one run with a time budget (docs/recording.md).
#
#   bash scripts/record_gpu.sh [BUDGET_SECONDS]      # default 360; run from the repository root
#
# What it does, in order (everything it writes goes under $OUT, default ./record-out):
#   1. installs NVIDIA's cuBLASLt bindings (nvmath-python) from ./.record-wheels when they are not importable
#      (for a machine without network, fill that git-ignored folder beforehand on a machine with one, for the
#      target's Python version X.Y, e.g.
#        pip download --only-binary=:all: --python-version X.Y --platform manylinux_2_28_x86_64 \
#            -d .record-wheels nvmath-python==1.0.0
#      which brings cuda-bindings, cuda-core and cuda-pathfinder along, about 20 MB; drop the numpy wheel);
#   2. `mmaemu info` (info.txt, info.json): the device, drivers, torch and cuBLASLt versions;
#   3. `mmaemu record --budget BUDGET` into a work folder: descriptor probe, sweep, replays, bundle (record.log);
#      if the descriptor probe refuses only because it cannot confirm the descriptor from cuBLASLt's log, and
#      that log shows a single workspace size, the recording is run again asserting that workspace (the bundle
#      records the assertion and the probe's problems; the replays then test the recorded decisions);
#   4. copies the bundle folder(s) and the probe log to $OUT (the partial recording stays in the work folder,
#      so running the script again on the same machine continues it).
set -uo pipefail

budget="${1:-360}"
out="${OUT:-$PWD/record-out}"
work="${MMAEMU_RECORD_WORK:-/tmp/mmaemu-record}"
mkdir -p "$out" "$work"
export MMAEMU_CACHE_DIR="${MMAEMU_CACHE_DIR:-/tmp/mmaemu-record-cache}" PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"
start=$(date +%s)

note() { echo "[record_gpu $(( $(date +%s) - start ))s] $*" | tee -a "$out/record.log"; }

note "python: $($py --version 2>&1); torch: $($py -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1)"
if ! $py -c "import nvmath.bindings.cublasLt" 2>/dev/null; then
    note "installing nvmath-python from .record-wheels"
    $py -m pip install -q --no-index --find-links .record-wheels nvmath-python 2>&1 | tail -5 | tee -a "$out/record.log"
fi
$py -c "import nvmath; print('nvmath-python', nvmath.__version__)" 2>&1 | tee -a "$out/record.log"

$py -m mmaemu info --json "$out/info.json" > "$out/info.txt" 2>&1
note "info written"

record() {
    $py -m mmaemu record --out "$work" --budget "$1" "${@:2}" 2>&1 | tee -a "$out/record.log"
    return "${PIPESTATUS[0]}"
}

left=$(( budget - ($(date +%s) - start) ))
record "$left"
status=$?
if [ "$status" -eq 1 ] && grep -q "descriptor probe does not confirm" "$out/record.log"; then
    probe_log=$(ls -t "$work"/*.probe.log 2>/dev/null | head -1)
    sizes=$(grep -o 'workSpaceSizeInBytes=[0-9]*' "$probe_log" 2>/dev/null | sort -u)
    left=$(( budget - ($(date +%s) - start) ))
    if [ -n "$probe_log" ] && [ "$(echo "$sizes" | grep -c .)" -eq 1 ] && [ "$left" -gt 60 ]; then
        ws=${sizes#workSpaceSizeInBytes=}
        note "retrying with the workspace the probe's log shows: $ws bytes (asserted)"
        record "$left" --torch-workspace "$ws"
        status=$?
    fi
fi

for path in "$work"/*; do
    [ -e "$path" ] || continue
    case "$path" in
        *.partial|*.lock) ;;
        *) cp -r "$path" "$out/" ;;
    esac
done
note "exit $status; bundle(s) and probe log copied to $out"
exit "$status"
