import os
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels (route_kernels.py) run in Triton's interpreter, on CPU tensors: it must be
# chosen before triton is first imported, which model.py does only when a forward asks for them
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

REPO = Path(__file__).resolve().parents[1]
SHARED_TIKTOKEN = REPO.parent / "shared/tiktoken_cache"

# the project's modules (model.py, shards.py, ...) live in the repository root
sys.path.insert(0, str(REPO))

# the tests use tiny models: intra-op threads cost more than they save there, far more on a busy machine
torch.set_num_threads(1)


@pytest.fixture
def gpt2_offline(monkeypatch):
    """tiktoken's gpt2 files from a local cache; skip rather than touch the network."""
    if not os.environ.get("TIKTOKEN_CACHE_DIR"):
        if not SHARED_TIKTOKEN.is_dir():
            pytest.skip("needs TIKTOKEN_CACHE_DIR (tiktoken's gpt2 files) to run offline")
        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(SHARED_TIKTOKEN))
