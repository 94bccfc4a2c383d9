"""``scripts/bench_gateway.py --quick``: it runs and prints its table with the ratios."""

from __future__ import annotations

import re

from tests.test_scripts import run


def test_bench_gateway_quick():
    out = run(["scripts/bench_gateway.py", "--quick"])
    assert "| path | wall ms/call | upstream CPU us/call | gateway CPU us/call |" in out, out
    ratio = r"([\d.]+x|n/a \(0 in the baseline: run more --calls\))"
    assert re.search(rf"^\| ratio gateway / direct \| [\d.]+x \| {ratio} \| \|$", out, re.M), out
