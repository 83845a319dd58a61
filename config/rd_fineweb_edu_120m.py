# The RD-AttnRes protocol at 120M (Role-Decoupled Attention Residuals, arXiv 2608.01075): GPT-2 small
# (12 x 768, 124.5M parameters with embeddings) trained on 2.0B FineWeb-Edu tokens, rd against its
# block-AttnRes parent, 5 paired seeds. The paper: rd better in 5 of 5 seeds, -0.030 nats.
# Data: python prepare.py finewebedu10B --shards 21   (2.1B train tokens, about the budget: train.py draws
#       its windows at random, so a token is read about once)
# Run:  python compare.py config/rd_fineweb_edu_120m.py --seeds=5 --runs=attnres/res_blocks=8,rd/res_blocks=8
# One GPU by default; under torchrun --nproc_per_node=N the same command keeps the tokens per iteration.
# Costs and the results table: README, "Reproducing the papers".

out_dir = "out-rd-fineweb-edu-120m"
eval_interval = 500
eval_iters = 100  # 100 x 16 x 1024 = 1.6M val tokens, the same windows in every run
log_interval = 10

dataset = "finewebedu10B"
block_size = 1024
batch_size = 16  # per micro-step; lower it (and raise gradient_accumulation_steps) on a GPU under 40 GB
gradient_accumulation_steps = 32  # micro-batches over all ranks: 32 x 16 x 1024 = 524,288 tokens per iteration

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
# Block AttnRes with 8 blocks (3 sublayers each): the AttnRes paper's choice, ~8 blocks recover most of
# per-sublayer routing's gain while keeping 9 sources in memory; the same 8 blocks at 343M
residual = "rd"
res_blocks = 8

# 3815 x 524,288 = 2,000,158,720 tokens: the paper's 2.0B (an exact 2.0B needs a sequence count
# of 5^9, which no batch that divides over 8 GPUs gives)
max_iters = 3815
lr_decay_iters = 3815
learning_rate = 6e-4  # GPT-3's for this size, as nanoGPT's GPT-2 small
min_lr = 6e-5
warmup_iters = 200
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

compile = True
