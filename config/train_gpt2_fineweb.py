# GPT-2 small (124M) from scratch on FineWeb 10B tokens, on one node of 8 GPUs, like nanoGPT's
# train_gpt2.py config: 12 x 1024 tokens x 5 micro-steps x 8 GPUs = 491,520 tokens per iteration.
# Data: python prepare.py fineweb10B --shards 103   (all 10B tokens; fewer shards for a shorter run)
# Run:  torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_fineweb.py
# Compare modes by changing residual (standard | attnres | delta | rd) with the same seed.

out_dir = "out-gpt2-fineweb"
eval_interval = 1000
eval_iters = 200
log_interval = 10

dataset = "fineweb10B"
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8  # all ranks together: 5 per GPU on 8 GPUs

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
residual = "delta"
res_blocks = 8  # block routing: 3 sublayers per block keeps routing memory at 9 sources

# 600,000 iterations x 0.5M tokens = 300B tokens, nanoGPT's full run; 20,000 iterations is one
# pass over the 10B tokens
learning_rate = 6e-4
max_iters = 20000
lr_decay_iters = 20000
min_lr = 6e-5
warmup_iters = 700
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

dtype = "bfloat16"
compile = True
