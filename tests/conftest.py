import sys
from pathlib import Path

# the project's modules (model.py, shards.py, ...) live in the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

# the tests use tiny models: intra-op threads cost more than they save there, far more on a busy machine
torch.set_num_threads(1)
