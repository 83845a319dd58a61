# nanoGPT's documented CPU recipe for character-level Shakespeare, here on UTF-8 bytes (vocab 256),
# in any residual mode: python train.py config/train_shakespeare_char.py --residual=attnres
# Data: python prepare.py shakespeare   (tiny Shakespeare, byte-level, into data/shakespeare)
# nanoGPT reports val loss ~1.88 after these 2000 iterations (standard residual, characters).

out_dir = "out-shakespeare-char"
eval_interval = 250
eval_iters = 20
log_interval = 1

dataset = "shakespeare"
gradient_accumulation_steps = 1
batch_size = 12
block_size = 64  # context of 64 bytes

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0

learning_rate = 1e-3  # a small model can take a high learning rate
max_iters = 2000
lr_decay_iters = 2000  # = max_iters
min_lr = 1e-4  # learning_rate / 10
beta2 = 0.99  # a little larger than 0.95: few tokens per iteration
warmup_iters = 100

device = "cpu"
compile = False
