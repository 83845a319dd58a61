# The Delta paper's recipe at small scale: GPT-2 124M, converted into a delta model (its
# pseudo-queries start at zero, so the converted model computes GPT-2's function exactly), then
# fine-tuned on Shakespeare.
# Data: python prepare.py shakespeare --tokenizer gpt2 --out data/shakespeare_gpt2
# The GPT-2 weights (500 MB) are downloaded from Hugging Face once, into cache/.

out_dir = "out-shakespeare-gpt2-delta"
eval_interval = 5
eval_iters = 40
log_interval = 1
always_save_checkpoint = False  # keep the best model: a small dataset overfits quickly

init_from = "gpt2"
residual = "delta"
res_blocks = 0  # per-sublayer routing: 24 routes over up to 24 sources

dataset = "shakespeare_gpt2"
# 1 x 32 x 1024 = 32,768 tokens per iteration; tiny Shakespeare is ~300K GPT-2 tokens, so one
# iteration is ~0.1 epoch
batch_size = 1
gradient_accumulation_steps = 32
block_size = 1024
max_iters = 20

# fine-tune at a constant small learning rate (nanoGPT's finetune_shakespeare); at 3e-5 Adam moves a
# zero pseudo-query by ~6e-4 per coordinate in 20 steps, so they get a 10x larger learning rate to
# move the routing off uniform within this short run
learning_rate = 3e-5
decay_lr = False
res_query_lr_mult = 10.0
