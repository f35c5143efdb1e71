import pathlib
import sys

# Test helpers (oracle.py, vectors.py) live next to the tests.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
