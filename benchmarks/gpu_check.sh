#!/usr/bin/env bash
# One prepared check of the GPU path, for a machine with a CUDA device, in one call of at most
# 10 minutes. Run from anywhere:  bash benchmarks/gpu_check.sh
#
# First, on a fresh device, the smoke (at most 120 s):  STEPS=smoke bash benchmarks/gpu_check.sh
#   what the CPU rehearsal of a first launch assumes (tests/support/standin_gpu.py) beside this
#   machine's answers (a difference goes into the rehearsal), one honest starter per backend judged
#   in fp16 and bf16, a tiny model served by an exported package's patch() in a plain process, and
#   one verify (benchmarks/gpu_smoke.py). If it fails, fix it and run the smoke again before the rest.
#
# Steps, most important first, each under its own `timeout` and all under one deadline (TOTAL_S,
# default 600 s), so the script ends in time whatever hangs; a step with no time left is named as
# skipped. Every line is printed as it comes and copied into one summary file,
# benchmarks/results/gpu-check-<date>-<device>.md (commit it).
#   2. GPU-marked tests (pytest -m gpu), but for step 6's
#   6. the timing attacks only a GPU can run (tests/attacks/test_gpu_timing.py: CUDA graph replay,
#      an allocator block holding an earlier answer, a side stream, CUDA C++ that calls PyTorch or
#      remembers inputs when timed), each of which must end in FAIL, beside the honest starters
#   8. compute-sanitizer memcheck and racecheck over every starter (clean) and the attack suite's
#      out-of-bounds and race kernels (caught), then the judge's own sanitizer path (sanitize_check.py)
#   3. the starters suite, Triton then CUDA C++, fp16 and bf16, one row per verdict as it finishes
#   1. compute-bound starters vs cuBLAS / SDPA / eager, met or short per row (compute_bound.py)
#   7. training: each starter's forward, backward and forward+backward against eager autograd,
#      torch.compile's joint graph and Liger Kernel where installed, with peak memory
#      (train_starters.py)
#   9. chains: the add+RMSNorm, SiLU x up, rotary q/k and projection + cross-entropy starters against
#      their operators in eager, torch.compile and Liger's fused ops (train_starters.py --types
#      ...)
#  10. a LLaMA (vocabulary 32000, 2 x 1024 tokens) training step's peak memory with and without the
#      fused loss, torch.cuda.max_memory_allocated beside the allocator's events (fused_loss_memory.py)
#  11. (only when named: STEPS=11) the fused loss through the product: autokernel optimize --train
#      of a LLaMA at vocabulary 32000 and 2 x 1024 tokens (tests/data/hf_llama_32k.py) for the
#      linear_cross_entropy chain alone, then its verify: verify.json's train.memory, the step's peak
#      memory eager and with the fused loss (torch.cuda.max_memory_allocated beside it)
#   5. three KernelBench level-1 problems with the tuner
#   4. the bf16 LLaMA: autokernel optimize with the tuner (budget: 3 minutes, or what the deadline
#      leaves less two minutes for profiling and verify: its workload and torch.compile of the model
#      unmodified and patched), then its verify (verify.json)
# The sandbox each verdict ran in is printed where verdicts carry a "sandbox" key.
#
# Environment: torch and triton preinstalled. Wheels to carry in .whl/ (Python 3.12, x86-64): what
# the project needs that the GPU machine lacks, openai and optuna with their own needs it lacks
# (httpx, pydantic, anyio, distro, jiter, sniffio; alembic, sqlalchemy, colorlog, tqdm), and
# kernels for the Hugging Face export; they are installed from there without an index. No pytest
# plugin is needed: the GPU tests run in one process (-p no:xdist, whatever is installed). The
# repository goes on PYTHONPATH.
#   DRY_RUN=1   the same steps on the CPU with tiny shapes and budgets (proves the script; no GPU)
#   TOTAL_S     the overall deadline in seconds (default 600; the smoke 120)
#   STEPS       which steps to run, in order, e.g. "1 3" (default "2 6 8 3 1 7 9 10 5 4": the LLaMA run takes
#               the time that is left, its tuner budget 3 minutes at most)
# shellcheck disable=SC2054  # the commas below are inside arguments (comma lists), not separators
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
DRY_RUN="${DRY_RUN:-0}"
STEPS="${STEPS:-2 6 8 3 1 7 9 10 5 4}"
START="${GPU_CHECK_START:-$(date +%s)}"
WORK="${GPU_CHECK_WORK:-$(mktemp -d /tmp/gpu_check.XXXXXX)}"
export GPU_CHECK_WORK="$WORK" GPU_CHECK_START="${GPU_CHECK_START:-$START}"

SCALE=1  # the interpreter is slow: a dry run gives every step three times as long
if [ "$DRY_RUN" = 1 ]; then
  SCALE=3
  DEVICE_NAME="cpu-dry-run"
else
  DEVICE_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)"
  DEVICE_NAME="${DEVICE_NAME:-unknown-gpu}"
fi
if [ "$STEPS" = smoke ]; then TOTAL_S="${TOTAL_S:-$(( 120 * SCALE ))}"; else TOTAL_S="${TOTAL_S:-600}"; fi
if [ "$DRY_RUN" = 1 ]; then
  DEV=(--device cpu)
  SUITE_TYPES=(--types reduce,matmul)
  SUITE_DTYPES="float32"
  SMOKE_DTYPES="float32"
  LLAMA=(examples/llama_tiny.py --class-name LlamaTiny --input-dtype tokens --vocab-size 2048
         --input-shape 1,8 --init-args '[2048, 64, 4, 4, 128]' --dtype bfloat16 --device cpu
         --agent tune --max-experiments 1 --top 1 --plain)
  KB=(--agent tune --budget-per-problem 20s --max-experiments 1 --device cpu --no-compile --reps 3)
  COMPUTE=(--dry-run)
  TRAIN=(--dry-run --types rmsnorm softmax)
  CHAINS=(--dry-run --types silu_mul rotary_qk)
  LOSS_MEMORY=(--tokens 64 --vocab 2000 --device cpu)
  LOSS_RUN=(tests/data/hf_llama_causal_tiny.py --device cpu)
else
  DEV=(--device cuda)
  SUITE_TYPES=(--types matmul,fused_mlp,flash_attention,rmsnorm,layernorm,softmax,cross_entropy,reduce,rotary_embedding)
  SUITE_DTYPES="float16 bfloat16"
  SMOKE_DTYPES="float16 bfloat16"
  LLAMA=(examples/llama_tiny.py --class-name LlamaTiny --input-dtype tokens --vocab-size 32000
         --input-shape 4,512 --init-args '[32000, 2048, 2, 16, 5632]' --dtype bfloat16 --device cuda
         --agent tune --plain)
  # no torch.compile baseline: its build would take most of the 45 s this step has
  KB=(--agent tune --budget-per-problem 15s --device cuda --precision fp16 --no-compile)
  COMPUTE=()
  TRAIN=(--dtype bfloat16)
  CHAINS=(--dtype bfloat16 --types add_rmsnorm silu_mul rotary_qk linear_cross_entropy)
  LOSS_MEMORY=(--device cuda)
  LOSS_RUN=(tests/data/hf_llama_32k.py --device cuda)
fi

# Seconds left before the deadline, less a margin for writing the summary.
left() { echo $(( TOTAL_S - ($(date +%s) - START) - 5 )); }

suite() {  # the starters suite for one backend, every dtype, rows streamed into one JSONL file
  local backend="$1"
  for dtype in $SUITE_DTYPES; do
    "$PY" -m autokernel bench --suite starters "${DEV[@]}" --backend "$backend" --dtype "$dtype" \
      "${SUITE_TYPES[@]}" --jsonl "$WORK/suite-$backend.jsonl" --json > /dev/null
  done
}

smoke_judges() {  # one honest starter per backend, judged in each dtype a GPU serves; exit 1 unless all PASS
  local rc=0 backend
  for backend in triton cuda; do
    for dtype in $SMOKE_DTYPES; do
      "$PY" -m autokernel bench --suite starters "${DEV[@]}" --backend "$backend" --dtype "$dtype" \
        --types softmax --no-backward --jsonl - --json > "$WORK/smoke-$backend-$dtype.jsonl" 2> "$WORK/smoke-$backend-$dtype.err"
      "$PY" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and "verdict" in l]
for v in rows:
    print(v.get("target") or v.get("kernel_file"), v.get("backend"), v["verdict"], v.get("failed_stage") or "",
          (v.get("timing") or {}).get("median_us"), "us")
    if v["verdict"] not in ("PASS", "COMPILE_ONLY"):
        print([s for s in v.get("stages", []) if s.get("status") == "fail"][:1])
sys.exit(0 if rows and all(v["verdict"] in ("PASS", "COMPILE_ONLY") for v in rows) else 1)
' "$WORK/smoke-$backend-$dtype.jsonl" || { rc=1; tail -n 20 "$WORK/smoke-$backend-$dtype.err"; }
    done
  done
  return $rc
}

sandboxes() {  # which sandbox the verdicts ran in, where they say
  cat "$WORK"/suite-*.jsonl 2>/dev/null | "$PY" -c '
import json, sys
seen = {}
for line in sys.stdin:
    v = json.loads(line)
    box = v.get("sandbox", "not recorded in the verdict")
    if isinstance(box, dict):  # one group per kind of sandbox, not per verdict: drop its own scratch folder
        box = {**box, "writes": [w for w in box.get("writes", []) if "ak-judge-" not in w] + ["its scratch folder"]}
    seen.setdefault(json.dumps(box), []).append(v.get("target", "?"))
for sandbox, targets in seen.items():
    print(f"sandbox {sandbox}: {len(targets)} verdict(s)")
'
}

kernelbench() {  # three level-1 problems the tuner's starters fit: a matmul, a softmax, a LayerNorm
  local kb="$WORK/kb"
  mkdir -p "$kb/level1"
  cp examples/kernelbench/matmul.py "$kb/level1/1_Matmul.py"
  cp tests/data/kernelbench/level1/23_Softmax.py "$kb/level1/23_Softmax.py"
  cp examples/kernelbench/layernorm.py "$kb/level1/40_LayerNorm.py"
  "$PY" -m autokernel kernelbench run --kb-dir "$kb" --level 1 --problems 1,23,40 "${KB[@]}" \
    --runs-dir "$WORK/kb-runs"
}

fused_loss_run() {  # optimize --train for the fused loss alone (its verify runs at the end), then its memory
  local runs="$WORK/loss-runs" run
  "$PY" -m autokernel optimize "${LOSS_RUN[@]}" --train --only linear_cross_entropy --max-experiments 0 \
    --budget 3m --agent tune --plain --runs-dir "$runs"
  run="$(find "$runs" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | head -n1)"
  [ -n "$run" ] && [ -f "$run/verify.json" ] && "$PY" -c '
import json, sys
v = json.load(open(sys.argv[1]))
train = v.get("train") or {}
print("verify:", json.dumps({k: v.get(k) for k in ("status", "failures", "chains")}))
print("fused loss in training:", json.dumps({t: {k: x.get(k) for k in ("calls_served", "fallbacks", "fallback_reasons")}
                                             for t, x in (train.get("per_kernel") or {}).items()}))
print("20 steps match eager:", train.get("match"), "; memory:", json.dumps(train.get("memory"), indent=1))
' "$run/verify.json"
}

llama() {  # optimize (which ends with its own verify, torch.compile timed too), then verify again if that did not happen
  local runs="$WORK/runs" tuner=$(( $(left) - 120 ))
  [ "$tuner" -gt 180 ] && tuner=180
  [ "$tuner" -lt 20 ] && tuner=20
  echo "tuner budget ${tuner} s"
  "$PY" -m autokernel optimize "${LLAMA[@]}" --budget "${tuner}s" --runs-dir "$runs"
  local rc=$? run
  run="$(find "$runs" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | head -n1)"
  if [ -n "$run" ] && [ ! -f "$run/verify.json" ]; then
    "$PY" -m autokernel verify "$run" "${DEV[@]}"
  fi
  [ -n "$run" ] && [ -f "$run/verify.json" ] && "$PY" -c '
import csv, json, sys
from pathlib import Path
run = Path(sys.argv[1])
v = json.loads((run / "verify.json").read_text())
measured, projected = v.get("e2e_speedup"), v.get("projected_e2e_speedup")
print("verify:", json.dumps({k: v.get(k) for k in ("status", "ok", "model_dtype", "failures", "not_run",
                                                      "eager_median_us", "patched_median_us", "sandbox")}))
if measured and projected:
    gap = abs(measured - projected) / projected
    print(f"end to end {measured:.3f}x measured vs {projected:.3f}x projected ({gap:.0%} apart; goal: >= 1.0x, within 15%)")
for target, k in v.get("per_kernel", {}).items():
    shown = {key: k.get(key) for key in ("dtype", "calls_served", "fallbacks", "kernel_speedup_vs_eager",
                                         "serving_range", "not_served")}
    print(f"  winner {target}:", json.dumps(shown))
work = v.get("workload") or {}
if work:
    print("workload:", work.get("summary"))
    for s in work.get("sets", []):
        shown = {key: s.get(key) for key in ("calls_served", "fallbacks", "outputs_match", "e2e_speedup",
                                             "compiled_e2e_speedup", "compile_error")}
        print("  input set " + s["name"] + ":", json.dumps(shown), "fallbacks:", json.dumps(s.get("fallback_reasons")))
seconds = []
for verdict in run.glob("kernels/*/exp_*.json"):
    split = json.loads(verdict.read_text()).get("judge_seconds") or {}
    if split.get("worker_total") is not None:
        seconds.append(split["worker_total"] + (split.get("parent_checks") or 0.0))
if seconds:
    seconds.sort()
    print(f"judge time per candidate: median {seconds[len(seconds) // 2]:.1f} s, max {seconds[-1]:.1f} s "
          f"over {len(seconds)} verdicts (goal: at most 10 s)")
' "$run"
  return $rc
}

# `timeout` runs programs, not shell functions: a step that is a function re-runs this script
if [ "${1:-}" = __call ]; then
  shift
  "$@"
  exit $?
fi

SLUG="$(printf '%s' "$DEVICE_NAME" | tr -cs 'A-Za-z0-9' '-' | sed 's/^-*//; s/-*$//' | tr '[:upper:]' '[:lower:]')"
mkdir -p benchmarks/results
SUMMARY="benchmarks/results/gpu-check-$(date -u +%Y-%m-%d)-${SLUG}.md"
: > "$SUMMARY"

say() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }

# step NAME WANT_S COMMAND...: run COMMAND under timeout min(WANT_S, time left), output streamed
# to the terminal and into the summary inside a fenced block; its exit status is recorded.
step() {
  local name="$1" want=$(( $2 * SCALE )); shift 2
  local budget; budget="$(left)"
  [ "$budget" -gt "$want" ] && budget="$want"
  say ""
  say "## $name"
  if [ "$budget" -lt 10 ]; then
    say "skipped: no time left before the ${TOTAL_S} s deadline"
    return 0
  fi
  say "\`$*\` (timeout ${budget} s)"
  say '```'
  local t0 rc; t0="$(date +%s)"
  local cmd=("$@")
  if declare -F "$1" > /dev/null; then cmd=(bash "${BASH_SOURCE[0]}" __call "$@"); fi
  timeout --kill-after=5 "$budget" "${cmd[@]}" 2>&1 | tee -a "$SUMMARY"
  rc="${PIPESTATUS[0]}"
  say '```'
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    say "result: cut at ${budget} s (every row above finished)"
  else
    say "result: exit ${rc} after $(( $(date +%s) - t0 )) s"
  fi
}

say "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), ${DEVICE_NAME}"
say ""
say "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), dry run: ${DRY_RUN}"
if compgen -G ".whl/*.whl" > /dev/null; then
  say "installing carried wheels from .whl/"
  timeout 90 "$PY" -m pip install -q --no-index --find-links .whl/ .whl/*.whl 2>&1 | tail -n 3 | tee -a "$SUMMARY"
fi
say "$("$PY" -c 'import sys, torch, triton; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}, cuda available: {torch.cuda.is_available()}")' 2>&1)"


for s in $STEPS; do
  case "$s" in
    smoke) step "What the CPU rehearsal assumes, and this machine" 15 "$PY" benchmarks/gpu_smoke.py machine
           step "One honest starter per backend, judged in each GPU dtype" 60 smoke_judges
           step "A tiny model served by an exported package's patch(), then verify" 45 \
             "$PY" benchmarks/gpu_smoke.py serve "${DEV[@]}" ;;
    1) step "Compute-bound starters vs cuBLAS, SDPA and eager" 110 \
         "$PY" benchmarks/compute_bound.py "${COMPUTE[@]}" ;;
    2) step "GPU-marked tests" 150 "$PY" -m pytest -m gpu -q -p no:cacheprovider -p no:xdist tests \
         --deselect tests/attacks/test_gpu_timing.py ;;
    3) step "Starters suite, Triton" 60 suite triton
       step "Starters suite, CUDA C++" 25 suite cuda
       step "Sandbox of the judged verdicts" 10 sandboxes ;;
    4) step "bf16 LLaMA: optimize with the tuner, then verify" 400 llama ;;
    5) step "KernelBench level 1, three problems, tuner" 45 kernelbench ;;
    9) step "Chains: fused starters vs their ops in eager, torch.compile and Liger, with memory" 60 \
         "$PY" benchmarks/train_starters.py "${CHAINS[@]}" ;;
    10) step "The fused loss: a LLaMA training step's peak memory with and without it" 60 \
         "$PY" benchmarks/fused_loss_memory.py "${LOSS_MEMORY[@]}" ;;
    11) step "The fused loss through optimize --train and verify: verify.json's step memory" 240 fused_loss_run ;;
    7) step "Training: starters forward+backward vs eager, torch.compile and Liger, with memory" 90 \
         "$PY" benchmarks/train_starters.py "${TRAIN[@]}" ;;
    6) step "Timing attacks only a GPU can run, beside the honest starters" 120 \
         "$PY" -m pytest -m gpu -q -p no:cacheprovider -p no:xdist tests/attacks/test_gpu_timing.py ;;
    8) step "compute-sanitizer: the starters clean, the attacks' race and out-of-bounds kernels caught" 120 \
         "$PY" benchmarks/sanitize_check.py --work "$WORK/sanitize" $([ "$DRY_RUN" = 1 ] && echo --dry-run) ;;
    *) say "unknown step $s" ;;
  esac
done

say ""
say "total $(( $(date +%s) - START )) s; summary in $SUMMARY; work files in $WORK"
