# The DLR paper's 130M class (DLR: zero-inference-cost latent residuals for low-rank pre-training,
# arXiv 2606.28932: its gains are clearest from 130M up). Its backbone is LLaMA (RMSNorm, SwiGLU,
# rotary positions) on C4; ours is GPT-2 small (12 x 768, 124.5M parameters dense) on FineWeb-Edu,
# so the numbers will not match its table, only the comparison: the four linears of every block
# low-rank, with and without DLR, against the dense model.
# Data: python prepare.py finewebedu10B --shards 25   (2.5B train tokens, about the budget: train.py draws
#       its windows at random, so a token is read about once)
# Run:  python compare.py config/dlr_fineweb_edu_130m.py --seeds=3 --runs=lowrank/rank=192,dlr/rank=192
# One GPU by default; under torchrun --nproc_per_node=N the same command keeps the tokens per iteration.
# Costs and the results table: README, "Reproducing the papers".

out_dir = "out-dlr-fineweb-edu-130m"
eval_interval = 500
eval_iters = 100  # 100 x 16 x 1024 = 1.6M val tokens, the same windows in every run
log_interval = 10

dataset = "finewebedu10B"
block_size = 1024
batch_size = 16
gradient_accumulation_steps = 32  # micro-batches over all ranks: 32 x 16 x 1024 = 524,288 tokens per iteration

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
residual = "standard"
# rank n_embd / 4 = 192 (the DLR paper's 130M rank is not in its public code): the block's linears then
# hold a third of the dense parameters and FLOPs (67.9M parameters in all), a compression where low rank
# trails dense, the gap DLR is meant to narrow; bench.py's default rank too
lowrank_rank = 192
lowrank_act = "silu"
dlr = True
dlr_alpha = 1.0

# 4750 x 524,288 = 2,490,368,000 tokens, 20.0 per dense parameter (Chinchilla's ~20)
max_iters = 4750
lr_decay_iters = 4750
learning_rate = 6e-4  # the dense GPT-2 small's, so that all three runs share every setting
min_lr = 6e-5
warmup_iters = 200
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

compile = True
