# The Delta paper's smallest scale (Delta Attention Residuals, arXiv 2605.18855: perplexity gains of
# 1.7-8.2% over 220M-7.6B): a GPT-2 of 14 x 1024 (228.9M parameters with embeddings) on FineWeb-Edu,
# standard vs attnres vs delta with per-sublayer ("Full") routing, where delta's sources are exactly
# the sublayers' outputs (for block routing add e.g. attnres/res_blocks=7,delta/res_blocks=7 to --runs).
# Data: python prepare.py finewebedu10B --shards 46   (4.6B train tokens, about the budget: train.py draws
#       its windows at random, so a token is read about once)
# Run:  python compare.py config/delta_fineweb_edu_220m.py --seeds=3 --runs=attnres/res_blocks=0,delta/res_blocks=0
# One GPU by default; under torchrun --nproc_per_node=N the same command keeps the tokens per iteration.
# Costs and the results table: README, "Reproducing the papers".

out_dir = "out-delta-fineweb-edu-220m"
eval_interval = 500
eval_iters = 200  # 200 x 8 x 1024 = 1.6M val tokens, the same windows in every run
log_interval = 10

dataset = "finewebedu10B"
block_size = 1024
batch_size = 8  # per micro-step: per-sublayer routing keeps up to 29 sources for the backward pass
gradient_accumulation_steps = 64  # micro-batches over all ranks: 64 x 8 x 1024 = 524,288 tokens per iteration

n_layer = 14
n_head = 16
n_embd = 1024
dropout = 0.0
residual = "delta"
res_blocks = 0

# 8750 x 524,288 = 4,587,520,000 tokens, 20.04 per parameter: Chinchilla's compute-optimal ~20
# tokens per parameter (we could not find the budget of the paper's 220M runs); fewer would compare
# undertrained models, whose gains need not be the paper's
max_iters = 8750
lr_decay_iters = 8750
learning_rate = 3e-4  # GPT-3's for its 350M model, of this width
min_lr = 3e-5
warmup_iters = 300
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

compile = True
