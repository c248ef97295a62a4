"""tools/smoke.py (what the sanitizer and valgrind runs execute) passes on the normal
build too, so that a change of semantics that breaks it fails here, not only in the
slow instrumented CI step."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fa_testutil import child_process_env

SMOKE = Path(__file__).resolve().parents[1] / "tools" / "smoke.py"

if not SMOKE.exists():      # tests copied out of the checkout (wheel checks)
    pytest.skip(f"no {SMOKE}", allow_module_level=True)


def test_smoke_script_passes():
    env, cwd = child_process_env()
    res = subprocess.run([sys.executable, str(SMOKE)], capture_output=True, text=True, env=env, cwd=cwd,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "checks passed" in res.stdout
