"""Run fastattn's test suite against the INSTALLED wheel (cibuildwheel test-command).

    python tools/cibw_test.py <project-dir> [test files and extra pytest args...]

Copies ``<project-dir>/tests`` (with README.md and docs/, whose snippets and links
``tests/test_readme.py`` checks) to a temporary directory and runs pytest there, so the
tests import the installed package, never the source tree.  Runs the suite with the
default kernel variant and then again with ``FASTATTN_ISA=baseline`` when the default
is not already the baseline.  Arguments that name files or folders under ``tests/``
replace the whole ``tests`` folder (e.g. ``tests/test_seed.py`` alone where the wheel's
tests run under emulation).  Cross-platform (no shell syntax), exits non-zero on any
failure.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    project, extra = os.path.abspath(argv[1]), argv[2:]
    with tempfile.TemporaryDirectory(prefix="fastattn-tests-") as tmp:
        tests = os.path.join(tmp, "tests")
        shutil.copytree(os.path.join(project, "tests"), tests,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        # tests/test_readme.py runs the README's snippets and checks its links into docs/
        shutil.copy(os.path.join(project, "README.md"), tmp)
        shutil.copytree(os.path.join(project, "docs"), os.path.join(tmp, "docs"),
                        ignore=shutil.ignore_patterns("_build"))
        env = dict(os.environ)
        env.pop("FASTATTN_ISA", None)
        env.pop("PYTHONPATH", None)
        probe = ("import os, fastattn, fastattn._dispatch as d; "
                 "print(d.VARIANT); print(os.path.dirname(fastattn.__file__))")
        out = subprocess.run([sys.executable, "-c", probe], cwd=tmp, env=env, check=True,
                             capture_output=True, text=True).stdout.split("\n")
        variant, location = out[0].strip(), out[1].strip()
        print(f"fastattn imported from {location} (default variant: {variant})", flush=True)
        if os.path.commonpath([location, project]) == project:
            print("ERROR: tests would import fastattn from the source tree", file=sys.stderr)
            return 1
        subprocess.run([sys.executable, "-c", "import fastattn; fastattn.show_config()"],
                       cwd=tmp, env=env, check=True)
        targets = [a for a in extra if a.replace("\\", "/").startswith("tests/")]
        options = [a for a in extra if a not in targets]
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--benchmark-disable", *(targets or ["tests"]), *options]
        runs = [("default", {})]
        if variant != "baseline":
            runs.append(("baseline", {"FASTATTN_ISA": "baseline"}))
        for name, update in runs:
            print(f"\n=== pytest, kernel variant: {name} ===", flush=True)
            rc = subprocess.run(cmd, cwd=tmp, env={**env, **update}).returncode
            if rc != 0:
                print(f"ERROR: pytest failed with variant {name} (exit {rc})", file=sys.stderr)
                return rc
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
