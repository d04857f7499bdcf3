"""bench/bench_secagg.py --quick runs as a user would, finishes, and prints its table.

(tests/test_bench_smoke.py does this for the older benches; this one lives beside the other
SecAgg tests until the lead folds it in there.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CEILING_S = 240.0  # a healthy --quick run takes about 10 s here with 2 busy cores

EXPECTED = [
    r"^SecAgg one round, update 1,000 elements",
    r"^mode\s+n\s+k\s+t\s+client up KB\s+down KB\s+client ms\s+gateway MB",
    r"^secagg\+\s+10\s+9\s+5\s+[\d.]+",
    r"^plain\s+10\s+9\s+5\s+[\d.]+",
    r"^secagg\+\s+30\s+16\s+9\s+[\d.]+",
    r"^plain\s+30\s+29\s+15\s+[\d.]+",
    r"^n=30: SecAgg\+ needs k=16 against plain SecAgg's 29",
    r"^traffic over the clear data: Bonawitz et al\. 1\.73x .* ours [\d.]+x",
]


def test_bench_secagg_quick_prints_its_table() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_secagg.py"), "--quick"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=CEILING_S, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    position = 0
    for pattern in EXPECTED:  # in this order
        found = [i for i, line in enumerate(lines) if i >= position and re.search(pattern, line)]
        assert found, f"no line matching {pattern!r} in:\n{done.stdout}"
        position = found[0] + 1
