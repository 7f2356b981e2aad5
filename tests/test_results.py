"""The README's results table is the one generated from the saved quality runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_results_table_matches_the_quality_runs():
    result = subprocess.run([sys.executable, "bench/results_md.py", "--check"], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
