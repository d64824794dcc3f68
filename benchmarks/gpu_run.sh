#!/usr/bin/env bash
# The executor's GPU measurements in one device call (docs/executor.md, "GPU run commands").
#
# Here, once (the GPU machine has torch and numpy but no network and not kvsched's other dependencies):
#   pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .gpu/wheels \
#       pydantic rich pandas pyyaml pytest pytest-xdist && rm .gpu/wheels/numpy-*
# On the device (carry .gpu), e.g. with a 480 s budget:
#   BUDGET=420 STEPS="tests profile vllm sarathi" bash benchmarks/gpu_run.sh
# FLAGS adds engine flags to every replay and to the profile, e.g. FLAGS="--kv-partition 512" (the next run:
#   FLAGS="--kv-partition 512" BUDGET=330 STEPS="tests profile sarathi sarathi_d10 opt_d10", docs/executor.md).
# Every step's table lands in one archive, $OUT/run.tgz: the device tool returns only a few files.
# A step starts only when its estimate fits what is left of BUDGET seconds.
set -u
BUDGET=${BUDGET:-420}
STEPS=${STEPS:-"tests sarathi_d10 opt_d10 sarathi profile vllm"}
FLAGS=${FLAGS:-}
ARCHIVE=${OUT:-/tmp}/run.tgz
W=$(mktemp -d)
T0=$(date +%s)
export PYTHONPATH=$PWD
log() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$W/log.txt"; }
python -m pip install -q --no-index --find-links .gpu/wheels pydantic rich pandas pyyaml pytest pytest-xdist \
    > "$W/pip.out" 2>&1 || log "pip install failed (see pip.out)"
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" \
    2>&1 | tee -a "$W/log.txt"
[ -n "$FLAGS" ] && log "engine flags: $FLAGS"

D=benchmarks/data/executor_h100
K="python -m kvsched.cli"
R="--model llama-2-7b-shape --device cuda --repeat 3 $FLAGS"
declare -A EST=([tests]=60 [sarathi_d10]=45 [opt_d10]=45 [sarathi]=90 [profile]=70 [vllm]=150)
declare -A CMD=(
    [tests]="python -m pytest -q -p no:cacheprovider --noconftest tests/test_executor_kernels.py tests/test_executor_engine.py"
    [sarathi_d10]="$K simulate $D/sg200d10.json -p sarathi -o $W/s10.json >/dev/null && $K replay $D/sg200d10.json $W/s10.json $R --check-oracle --oracle-limit 50 --out $W/sarathi_d10.csv"
    [opt_d10]="$K replay $D/sg200d10.json $D/opt_d10.schedule.json $R --check-oracle --oracle-limit 50 --out $W/opt_d10.csv"
    [sarathi]="$K simulate $D/sg200.json -p sarathi -o $W/s.json >/dev/null && $K replay $D/sg200.json $W/s.json $R --check-oracle --oracle-limit 20 --out $W/sarathi.csv"
    [profile]="$K profile --model llama-2-7b-shape --device cuda --out $W/profile --repeat 3 $FLAGS"
    [vllm]="$K simulate $D/sg200.json -p vllm -o $W/v.json >/dev/null && $K replay $D/sg200.json $W/v.json $R --check-oracle --oracle-limit 5 --out $W/vllm.csv"
)
for step in $STEPS; do
    left=$((BUDGET - ($(date +%s) - T0)))
    if ((left < ${EST[$step]:-9999})); then log "skip $step (estimate ${EST[$step]:-?} s, $left s left)"; continue; fi
    log "start $step"
    timeout $((left - 5)) bash -c "${CMD[$step]}" > "$W/$step.out" 2>&1
    log "end $step rc=$?"
    grep -E "replayed|oracle|passed|failed|rows ->" "$W/$step.out" | tee -a "$W/log.txt"
done
rm -f "$W"/s10.json "$W"/s.json "$W"/v.json
tar czf "$ARCHIVE" -C "$W" . && log "wrote $ARCHIVE"
