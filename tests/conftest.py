import sys
from pathlib import Path

# the project's modules (model.py, shards.py, ...) live in the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
