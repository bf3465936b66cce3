"""Lets the protocol tests share `protocol_strategies` (pytest runs with --import-mode=importlib)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
