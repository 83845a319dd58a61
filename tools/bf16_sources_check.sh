#!/usr/bin/env bash
# The paired-seed check behind bf16_sources=True (the fused route's default on GPUs): the same 8-layer
# rd (or RESIDUAL) runs of config/train_shakespeare_char.py (2000 iterations), seeds 0-2, with the routing sources
# stored in bfloat16 and in float32, all six at once on one GPU; prints each run's final val loss and
# the paired difference (bf16 - fp32), mean and std over the seeds.
#
#     python prepare.py shakespeare && tools/bf16_sources_check.sh [OUT_DIR [RES_BLOCKS [RESIDUAL]]]   # ~1 minute on an H200
#
# RES_BLOCKS: the routing blocks, 0 (per sublayer, the default) or a divisor of 16 such as 4. With blocks the
# running block sums are sources too, kept in bfloat16 as they grow (a rounding per sublayer added), which
# per-sublayer routing has none of: check them with 4. data/shakespeare must be there (a GPU machine without
# a network: prepare it elsewhere and copy it over). RESIDUAL: rd (the default), attnres or delta; in delta the
# sources are the stream's changes, and in bfloat16 they no longer add up to the float32 stream exactly.
set -euo pipefail
cd "$(dirname "$0")/.."
res_blocks=${2:-0}
residual=${3:-rd}
out=${1:-out-bf16-sources}/$residual/res_blocks=$res_blocks
export PYTHONUNBUFFERED=1
mkdir -p "$out"
rm -rf "$out"/bf16_sources=True "$out"/bf16_sources=False  # a rerun trains afresh (train.py never replaces a run's checkpoint)
pids=()
for seed in 0 1 2; do
  for bf16 in True False; do
    python3 train.py config/train_shakespeare_char.py --device=cuda --n_layer=8 --residual=$residual --res_blocks=$res_blocks --seed=$seed \
      --bf16_sources=$bf16 --out_dir="$out/bf16_sources=$bf16/seed$seed" >"$out/seed$seed.$bf16.log" 2>&1 &
    pids+=($!)
  done
done
for pid in "${pids[@]}"; do
  wait "$pid" || { echo "a training run failed: see $out/seed*.log" >&2; kill "${pids[@]}" 2>/dev/null; exit 1; }
done
python3 - "$out" "$res_blocks" "$residual" <<'PY'
import json, statistics, sys
def val_loss(bf16, seed):
    events = [json.loads(line) for line in open(f"{sys.argv[1]}/bf16_sources={bf16}/seed{seed}/log.jsonl")]
    return next(e["val_loss"] for e in events if e["event"] == "done")
print(f"8-layer {sys.argv[3]}, res_blocks={sys.argv[2]} (0: per sublayer), {sys.argv[1]}:")
rows = [(seed, val_loss(True, seed), val_loss(False, seed)) for seed in range(3)]
for seed, bf16, fp32 in rows:
    print(f"seed {seed}: val loss bf16 sources {bf16:.4f}, float32 sources {fp32:.4f}, difference {bf16 - fp32:+.4f}")
diffs = [bf16 - fp32 for _, bf16, fp32 in rows]
print(f"paired difference (bf16 - float32): {statistics.fmean(diffs):+.4f} +- {statistics.stdev(diffs):.4f} nats "
      f"over {len(diffs)} seeds ({sum(d < 0 for d in diffs)} of them lower with bf16)")
PY
