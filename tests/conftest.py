"""The benchmark helpers (``scripts/bench_lib``) import as ``bench_lib``, as the scripts see them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
