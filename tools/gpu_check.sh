#!/usr/bin/env bash
# The GPU check: what this project promises on one CUDA GPU, in one command, into one log and one JSON
# summary. The parts that only check that something works (tests, training, sampling, compiling the route's
# kernels) run side by side first; the parts that time (route, bench, compiled) then run one at a time,
# alone on the GPU. Estimated from the parts' times on an H200 (2026-12-04), with the GPU tests now about twice
# as many (over 100, from 58) and rd's paired kernels compiled in the bench: about 6 minutes on a fresh machine,
# where one after another the parts would take about 9; the first run will say (each part's seconds are in
# the log and the summary).
#
#     tools/gpu_check.sh [OUT_DIR [PART ...]]    # default gpu_check/, every part; OUT_DIR/summary.json
#
# The parts (name them to run only those; the summary reads whatever OUT_DIR holds):
# side by side (their speed is not a measurement: the train logs' tokens/s are taken beside the tests)
#   tests   tests/test_gpu.py and tests/test_route_kernels.py on the GPU (pytest-xdist's -n 8 where installed)
#   train   python train.py, 200 iterations on the GPU: the default (a delta model) and rd with low-rank
#           DLR linears
#   sample  sample.py from the first; fold.py on the second, then sample.py from the folded checkpoint
#   (route) route_warm: the route kernels compiled into Triton's cache (route_kernels.py --warm) for routes over
#           1 to 25 sources, every one a 12-layer model reads, at the default tile and the route part's other
#           tiles, a process each, at once: the timed route and bench parts then compile no route kernel
# then one at a time
#   route   one route over 25 sources against its memory-traffic floor and a copy of as many bytes
#           (python route_kernels.py), two routes paired in one pass against two routes (rd), and both
#           at four other tiles: a one-warp program (1024:1), whose per-token sums need no
#           barrier, with and without prefetching the next source; the default tile with prefetching, so
#           the next load overlaps this source's barriers; more programs per multiprocessor (2048:4). What
#           each compiles to: python route_kernels.py --compile_for=90 --tiles=... (no GPU needed)
#   bench   bench.py at GPT-2-small shape (12 x 768, batch 16 x 1024, bfloat16, eager) with the fused
#           route, then with model.py's plain route, side by side within each run. The fused route runs
#           at the route part's fastest tile (the default unless another was 3% faster; the log and
#           the JSON say which), so one lease finds a better tile and benches the model with it. rd's
#           paired kernels run at their own fastest tile: the route part times the pair at every tile too
# and, when named:
#   compiled  (~4 minutes more) bench.py --compile (at the same tiles) on standard, attnres (per sublayer and res_blocks=4) and rd/res_blocks=4:
#             the training step and the one-token decode step (a CUDA graph) compiled apart, each row's
#             compile times, and what recompiled or broke a graph (TORCH_LOGS); sample.py --compile
#   compiled_sublayers  (~2 minutes more) the same bench with --compile_sublayers: each layer's two sublayers compiled (the
#             graphs every layer and row shares), the routes between them eager: its compile time and speed
#             beside the whole model's
# Each part has a time limit, and a failed part does not stop the others: the summary lists the failed ones
# ("failed"), and the script ends with exit 1 when a part it ran failed (2: called wrongly, nothing ran). Each part
# first removes what an earlier run of it wrote, so a failed part leaves no earlier result to be read as its own. The
# side-by-side parts share the machine, so their limits are about twice what each took alone; a cold route
# part (its warm-up failed) compiles its twenty kernels itself, within its own limit. Each part's output is
# in OUT_DIR/logs/ as it runs; the side-by-side parts' reach the log when all of them have ended.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check}
shift || true
parts=${*:-tests train sample route bench}
known="tests train sample route bench compiled compiled_sublayers"
for name in $parts; do  # a misspelt part would otherwise run nothing and pass (unquoted: "route bench" is two)
  if [[ " $known " != *" $name "* ]]; then
    echo "tools/gpu_check.sh: no part named '$name': name parts from $known" >&2
    exit 2
  fi
done
if [[ -e $out && ! -d $out ]]; then
  echo "tools/gpu_check.sh: OUT_DIR $out is a file: name a folder (it is made if missing)" >&2
  exit 2
fi
if ! mkdir -p -- "$out" 2>/dev/null || [[ ! -w $out ]]; then
  echo "tools/gpu_check.sh: cannot write to OUT_DIR $out: name a folder you can write (it is made if missing)" >&2
  exit 2
fi
rm -rf "$out/logs" && mkdir "$out/logs"  # this run's parts' logs; the log keeps every run's
rm -f "$out/summary.json"  # a run stopped before its summary must not leave an earlier run's
ran_before=0  # parts.txt's lines from earlier runs: this run's are those after them
[[ -f $out/parts.txt ]] && ran_before=$(wc -l <"$out/parts.txt")
# this run's date and commit, above its parts' lines: the summary gives each part the run it came from, so a part
# kept from an earlier run (one not named this time) is not shown as this run's
commit=$(git rev-parse HEAD 2>/dev/null) || commit=none
[[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && tree=dirty || tree=clean
echo "# run $(date -u '+%Y-%m-%dT%H:%MZ') $commit $tree" >>"$out/parts.txt"
log="$out/gpu_check.log"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # the compiled kernels, not the CPU interpreter the CPU tests use

part() {  # part NAME SECONDS COMMAND...: run it under a time limit into logs/NAME.log, then into the log (side by side: to_log)
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "=== $name (limit ${limit} s): $*" | tee "$out/logs/$name.log"
  timeout "$limit" "$@" >>"$out/logs/$name.log" 2>&1
  rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$out/logs/$name.log"
  echo "$name $rc $((SECONDS - t0)) ${side_by_side:-}" >>"$out/parts.txt"  # one short line: appends from parallel parts stay whole
  [[ -n ${side_by_side:-} ]] || cat "$out/logs/$name.log" >>"$log"
}
to_log() {  # to_log NAME...: the side-by-side parts' logs, those that ran this time, appended to the log in this order
  local name
  for name; do [[ -f "$out/logs/$name.log" ]] && cat "$out/logs/$name.log" >>"$log"; done
  return 0
}
wants() { [[ " $parts " == *" $1 "* ]]; }
# a rerun adds to the log and to parts.txt (the summary keeps each part's latest result): say when and what
echo "##### $(date -u '+%Y-%m-%d %H:%M UTC'): tools/gpu_check.sh $out $parts" | tee -a "$log"

route_tiles=1024:1,1024:1:prefetch,4096:4:prefetch,2048:4  # the route part's tiles besides the default

# Side by side: each lane a background job, its parts in order; the summary marks their parts "side_by_side".
side_by_side=side_by_side
if wants tests; then
  workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
  rm -f "$out/tests.xml"
  part tests 420 python3 -m pytest -q -rs $workers tests/test_gpu.py tests/test_route_kernels.py --junitxml="$out/tests.xml" &
fi
if wants train || wants sample; then
  (
    if wants train; then
      rm -rf "$out/train_delta" "$out/train_rd_dlr"  # a rerun trains afresh (train.py never replaces a run's checkpoint)
      part prepare 120 python3 prepare.py
      part train_delta 240 python3 train.py --max_iters=200 --eval_interval=100 --log_interval=10 --out_dir="$out/train_delta"
      part train_rd_dlr 240 python3 train.py --max_iters=200 --eval_interval=100 --log_interval=10 --residual=rd \
        --lowrank_rank=32 --dlr=True --out_dir="$out/train_rd_dlr"
    fi
    if wants sample; then
      part sample 120 python3 sample.py --out_dir="$out/train_delta" --num_samples=1 --max_new_tokens=200
      rm -f "$out/train_rd_dlr/folded.pt"  # a failed fold must not leave an earlier one to sample_folded
      part fold 120 python3 fold.py --ckpt="$out/train_rd_dlr/ckpt.pt" --out="$out/train_rd_dlr/folded.pt" --device=cuda
      part sample_folded 120 python3 sample.py --ckpt="$out/train_rd_dlr/folded.pt" --num_samples=1 --max_new_tokens=100
    fi
  ) &
fi
warm_tiles() {  # a process per tile, all at once: the default tile's, and each of route_tiles' alone
  local pids=() tile pid rc=0
  python3 route_kernels.py --warm & pids+=($!)
  for tile in ${route_tiles//,/ }; do python3 route_kernels.py --warm --only_tiles --tiles="$tile" & pids+=($!); done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return $rc
}
if wants route; then
  export route_tiles && export -f warm_tiles
  part route_warm 300 bash -c warm_tiles &
fi
wait
to_log tests prepare train_delta train_rd_dlr sample fold sample_folded route_warm

# One at a time, alone on the GPU: the parts that time
side_by_side=
if wants route; then
  rm -f "$out/route.json"  # a failed or timed-out route part must not leave an earlier run's tile to the bench
  part route 300 python3 route_kernels.py --json="$out/route.json" --tiles=$route_tiles
fi
# the route part's fastest tiles, one route's and a pair's, for the bench parts (see "bench" above); none
# without its JSON: the defaults
route_tile=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print("--route_tile=%s --paired_route_tile=%s" % (r["fastest_tile"], r["fastest_paired_tile"]))' "$out/route.json" 2>/dev/null)
if [[ -n $route_tile ]] && { wants bench || wants compiled || wants compiled_sublayers; }; then
  echo "=== the bench parts' route tiles: $route_tile ($out/route.json's fastest)" | tee -a "$log"
fi
if wants bench; then
  bench=(python3 bench.py --device=cuda --dtype=bfloat16 --n_layer=12 --n_embd=768 --n_head=12 --batch_size=16
         --block_size=1024 --rounds=3 --decode_tokens=16)
  # 46 s on the H200 before rd's paired kernels, with its route kernels compiled inside; route_warm now compiles
  # them for every source count at every tile, and the limit leaves room for a cold run
  rm -f "$out/bench_eager_fused.json" "$out/bench_eager_plain.json"
  part bench_fused 300 "${bench[@]}" $route_tile --json="$out/bench_eager_fused.json" \
    --rows=standard,attnres/res_blocks=0,attnres/res_blocks=4,delta/res_blocks=0,rd/res_blocks=0,rd/res_blocks=4
  part bench_plain 120 "${bench[@]}" --json="$out/bench_eager_plain.json" --fused_route=false \
    --rows=standard,attnres/res_blocks=0,attnres/res_blocks=4,rd/res_blocks=4
fi
# the compiled bench: the training step and the decode step compiled apart, at the same tiles (compiled_sublayers:
# the training step's sublayers only)
compiled_bench=(env TORCH_LOGS=recompiles,graph_breaks python3 bench.py --device=cuda --dtype=bfloat16 --n_layer=12 --n_embd=768
                --n_head=12 --batch_size=16 --block_size=1024 --rounds=2 --decode_tokens=8 --compile $route_tile
                --rows=standard,attnres/res_blocks=4,rd/res_blocks=4,attnres/res_blocks=0)
if wants compiled; then
  rm -f "$out/bench_compiled_fused.json"
  part bench_compiled 450 "${compiled_bench[@]}" --json="$out/bench_compiled_fused.json"
  if [[ -f "$out/train_delta/ckpt.pt" ]]; then
    part sample_compiled 120 python3 sample.py --out_dir="$out/train_delta" --num_samples=1 --max_new_tokens=200 --compile
  fi
fi
if wants compiled_sublayers; then
  rm -f "$out/bench_compiled_sublayers.json"
  part bench_compiled_sublayers 240 "${compiled_bench[@]}" --compile_sublayers --json="$out/bench_compiled_sublayers.json"
fi
python3 tools/gpu_summary.py "$out" | tee -a "$log"
summarised=$?
failed=$(tail -n "+$((ran_before + 1))" "$out/parts.txt" | awk '$1 != "#" && $2 != 0 { printf " %s", $1 }')
if [[ -n $failed ]]; then
  echo "##### failed:$failed (their output: $out/logs/)" | tee -a "$log"
  exit 1
fi
exit $summarised
