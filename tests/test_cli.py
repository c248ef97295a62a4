"""The ``fastattn`` command: walkthrough, ``info``, ``bench`` and the unbuilt-tree hint.

The statistics behind ``fastattn bench``'s trust flags are checked on synthetic
timings; one tiny real run checks that the worker processes answer.  The hint
for an unbuilt source tree is checked on a copy of the package without its
compiled modules, run the way a new user runs it: ``python -m fastattn`` from
the checkout's root.
"""
from __future__ import annotations

import importlib.metadata
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastattn
from fastattn import __main__ as cli
from fastattn import _quickbench as Q
from fastattn import _unbuilt

PKG = Path(fastattn.__file__).resolve().parent
HINT_BUILD = "python setup.py build_ext --inplace"


def _env(**extra):
    """The environment of a child that must import the fastattn under test."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(PKG.parent)
    env.update(extra)
    return env


def _walkthrough_text():
    out = io.StringIO()
    assert cli.walkthrough(out) == 0
    return out.getvalue()


# --------------------------------------------------------------------------- the command

def test_walkthrough_is_the_default(capsys):
    assert cli.main([]) == 0
    default = capsys.readouterr().out
    assert cli.main(["walkthrough"]) == 0
    assert capsys.readouterr().out == default
    assert "FAILED" not in default
    assert "All checks passed" in default
    assert "softmax([2, 1, 0]) = [0.665241, 0.244728, 0.0900306]" in default


def test_python_m_fastattn_outside_the_tree(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fastattn"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == _walkthrough_text()
    assert proc.stderr == ""


def test_console_script_entry_point():
    """``fastattn`` is declared (installed: registered) as ``fastattn.__main__:main``."""
    try:
        eps = importlib.metadata.entry_points(group="console_scripts", name="fastattn")
    except importlib.metadata.PackageNotFoundError:        # pragma: no cover
        eps = ()
    installed = [ep for ep in eps if ep.dist is not None and ep.dist.name == "fastattn"]
    if installed:
        assert installed[0].load() is cli.main
    else:   # a source-tree run: the declaration in pyproject.toml
        text = (PKG.parent / "pyproject.toml").read_text()
        scripts = re.search(r"(?ms)^\[project\.scripts\]\s*(.*?)^\[", text)
        assert scripts and re.search(r'(?m)^fastattn\s*=\s*"fastattn\.__main__:main"', scripts.group(1))


def test_console_script_runs_when_installed(tmp_path):
    script = shutil.which("fastattn", path=str(Path(sys.executable).parent))
    if script is None:
        # source-tree run: the entry point itself, as the console script calls it
        proc = subprocess.run([sys.executable, "-c", "import sys; from fastattn.__main__ import main; "
                               "sys.exit(main(['info']))"], cwd=tmp_path, env=_env(),
                              capture_output=True, text=True, timeout=60)
    else:
        proc = subprocess.run([script, "info"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "variant in use" in proc.stdout


def test_info_prints_show_config(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert out == fastattn.show_config(file=io.StringIO())
    assert fastattn.__version__ in out and "variant in use" in out


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for word in ("walkthrough", "bench", "info"):
        assert word in out
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "noisy" in out and "--repeats" in out and "decode" in out


@pytest.mark.parametrize("argv, message", [
    (["bench", "--repeats", "2"], "at least 3"),
    (["bench", "--cases", "prefill,nope"], "unknown case(s) nope"),
    (["bench", "--threads", "0"], "must be > 0"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_tiny_run(capsys):
    """One real run: the workers start, alternate, answer, and the table comes out."""
    rc = cli.main(["bench", "--cases", "tiny", "--repeats", "3", "--min-time", "0.01",
                   "--threads", "1", "--no-torch"])
    assert rc == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("| tiny |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert re.fullmatch(r"[\d.]+ µs ±[\d?]+%.*", cells[2]), cells     # fastattn
    assert re.fullmatch(r"[\d.]+ µs ±[\d?]+%.*", cells[3]), cells     # numpy
    assert re.fullmatch(r"[\d.]+× ±[\d?]+%.*", cells[4]), cells       # the ratio
    assert float(cells[7]) < 1e-5                                     # max err


def test_bench_run_alternates_and_counts():
    case = next(c for c in Q.ALL_CASES if c["id"] == "tiny")
    res = Q.run([case], threads=1, repeats=3, min_time=0.01, torch=False, progress=io.StringIO())
    runs = res["cases"][0]["runs"]
    assert set(runs) == {"fastattn", "numpy"}
    for lib, rs in runs.items():
        assert len(rs) == 3 and all("error" not in r and r["seconds"] > 0 for r in rs), rs
        if sys.platform.startswith("linux"):
            assert all(r["preemptions_per_s"] >= 0 for r in rs)
    assert runs["fastattn"][0]["max_err"] < 1e-5          # checked once, on the first request


# --------------------------------------------------------------------------- statistics

def test_quartiles_match_numpy(rng):
    for n in (1, 2, 3, 4, 5, 8, 13):
        xs = rng.random(n).tolist()
        np.testing.assert_allclose(Q.quartiles(xs), np.percentile(xs, [25, 50, 75]), rtol=1e-12)
    with pytest.raises(ValueError):
        Q.quartiles([])


def test_one_slow_repeat_does_not_make_a_382x_ratio():
    """The reported incident: NumPy took 6 s in one call and 0.1 s in the next."""
    fa = [0.016, 0.016, 0.017, 0.016, 0.016]
    numpy = [6.0, 0.10, 0.11, 0.10, 0.12]
    s = Q.summarize_case({"kind": "attention"}, {"fastattn": _runs(fa), "numpy": _runs(numpy)})
    assert s["time"]["numpy"]["median"] == pytest.approx(0.11)
    assert 5 < s["ratio"]["numpy"]["median"] < 8            # not 6.0 / 0.016 = 375
    assert not s["ratio"]["numpy"]["noisy"]                # one outlier in five: still trusted


def test_two_slow_repeats_are_flagged():
    numpy = [6.0, 5.5, 0.10, 0.12, 0.11]
    s = Q.summarize(numpy)
    assert s["noisy"] and s["spread"] > Q.NOISY_SPREAD


def test_steady_repeats_are_trusted():
    s = Q.summarize([1.00, 1.03, 0.98, 1.01, 0.99])
    assert s == {"median": 1.0, "spread": pytest.approx((1.01 - 0.99) / 2), "n": 5,
                 "noisy": False, "busy": False}


def test_too_few_repeats_cannot_be_trusted():
    s = Q.summarize([1.0, 1.0])
    assert s["spread"] is None and s["noisy"]
    assert Q.summarize([None, None]) is None
    assert Q.summarize([1.0, None, 1.0, None])["noisy"]    # failures do not count


def test_paired_ratios_survive_a_drifting_machine():
    """Both libraries slow down together: their times spread, their ratio does not."""
    drift = [1.0, 2.0, 3.0, 2.0, 1.0]
    s = Q.summarize_case({"kind": "attention"},
                         {"fastattn": _runs([d * 1e-3 for d in drift]),
                          "numpy": _runs([d * 1e-2 for d in drift])})
    assert s["time"]["fastattn"]["noisy"] and s["time"]["numpy"]["noisy"]
    assert s["ratio"]["numpy"]["median"] == pytest.approx(10.0)
    assert s["ratio"]["numpy"]["spread"] == pytest.approx(0.0, abs=1e-12)
    assert not s["ratio"]["numpy"]["noisy"]


def test_paired_ratios_skip_failed_repeats():
    assert Q.paired_ratios([2.0, None, 9.0, 4.0], [1.0, 1.0, 3.0, None]) == [2.0, 3.0]
    s = Q.summarize_case({"kind": "attention"},
                         {"fastattn": _runs([1.0, 1.0, 1.0]) + [{"error": "boom"}],
                          "numpy": _runs([2.0, 2.0, 2.0, 50.0])})
    assert s["ratio"]["numpy"]["n"] == 3 and s["ratio"]["numpy"]["median"] == 2.0
    assert s["errors"] == {"fastattn": "boom"}


def test_preempted_measurements_are_busy_even_when_steady():
    """A shared CPU can make times steady and several times too slow (seen: 12.00 ms
    instead of 2.1 ms, repeat after repeat): the preemption count flags it."""
    fa = _runs([0.012] * 5, preemptions=[125.0] * 5)
    numpy = _runs([0.004] * 5, preemptions=[0.0] * 5)
    s = Q.summarize_case({"kind": "attention"}, {"fastattn": fa, "numpy": numpy})
    assert not s["time"]["fastattn"]["noisy"] and s["time"]["fastattn"]["busy"]
    assert not s["time"]["numpy"]["busy"]
    assert s["ratio"]["numpy"]["busy"]                     # a pair is as busy as its busier side
    # one busy repeat in five does not make the median busy
    assert not Q.summarize([1.0] * 5, preemptions=[0, 0, 500, 0, 1])["busy"]
    # no count (Windows): only the spread decides
    assert not Q.summarize([1.0] * 5, preemptions=[None] * 5)["busy"]


def test_cells_show_the_spread_and_the_flags():
    assert Q.fmt_figure(None, Q.fmt_ratio) == "—"
    assert Q.fmt_figure(Q.summarize([10.0, 10.0, 10.4]), Q.fmt_ratio) == "10× ±1%"
    assert Q.fmt_figure(Q.summarize([1.0, 2.0, 3.0]), Q.fmt_ratio) == "2× ±25% noisy"
    assert (Q.fmt_figure(Q.summarize([1.0, 2.0, 3.0], preemptions=[99] * 3), Q.fmt_ratio)
            == "2× ±25% noisy busy")
    assert [Q.fmt_ratio(r) for r in (0.9534, 12.34, 382.4, 5471.0)] == ["0.953×", "12.3×", "382×", "5471×"]


def _report(fa, numpy):
    case = next(c for c in Q.ALL_CASES if c["id"] == "prefill")
    results = {"threads": 2, "repeats": len(fa), "libs": ["fastattn", "numpy"],
               "loadavg": [0.1, 0.2],
               "cases": [{"case": case, "runs": {"fastattn": fa, "numpy": numpy}}]}
    out = io.StringIO()
    return Q.report(results, out), out.getvalue()


def test_report_flags_untrusted_figures():
    n, text = _report(_runs([0.01, 0.01, 0.01]), _runs([0.1, 0.5, 2.0]))
    assert n == 2                                          # numpy's time and the ratio
    assert "noisy:" in text and "rerun on an idle machine" in text.lower()
    row = next(ln for ln in text.splitlines() if ln.startswith("| prefill |"))
    assert row.count("noisy") == 2


def test_report_is_quiet_when_the_figures_agree():
    n, text = _report(_runs([0.010, 0.0101, 0.0099]), _runs([0.100, 0.101, 0.099]))
    assert n == 0
    assert "noisy" not in text and "busy" not in text
    assert "| 10× ±" in text


def _runs(seconds, preemptions=None):
    preemptions = preemptions or [None] * len(seconds)
    return [{"seconds": s, "preemptions_per_s": p} for s, p in zip(seconds, preemptions)]


# --------------------------------------------------------------------------- unbuilt tree

@pytest.fixture
def unbuilt_checkout(tmp_path):
    """A copy of the package's Python and Cython sources, no compiled modules, laid
    out as a checkout (setup.py and pyproject.toml beside it)."""
    root = tmp_path / "checkout"
    shutil.copytree(PKG, root / "fastattn",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "*.dylib", "__pycache__"))
    (root / "setup.py").write_text("# placeholder: the test never builds\n")
    (root / "pyproject.toml").write_text('[project]\nname = "fastattn"\nversion = "0"\n')
    assert not _unbuilt.compiled_kernels_present(str(root / "fastattn"))
    return root


def _run_in(root, *args, env=None):
    env = env if env is not None else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=60)


def test_python_m_fastattn_in_unbuilt_tree_gives_one_line(unbuilt_checkout):
    proc = _run_in(unbuilt_checkout, "-m", "fastattn")
    assert proc.returncode in (1, 2)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("fastattn: ") and HINT_BUILD in lines[0]
    assert "`fastattn" in lines[0]                       # the console script is named
    assert str(unbuilt_checkout) in lines[0]


def test_python_m_fastattn_in_unbuilt_tree_names_the_installed_command(unbuilt_checkout):
    """With a built fastattn further down sys.path: say to run `fastattn <args>`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(PKG.parent)
    proc = _run_in(unbuilt_checkout, "-m", "fastattn", "bench", "--threads", "1", env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "run `fastattn bench --threads 1` instead" in line
    assert str(PKG) in line and HINT_BUILD in line


def test_import_in_unbuilt_tree_raises_the_hint(unbuilt_checkout):
    proc = _run_in(unbuilt_checkout, "-c", "import fastattn")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: fastattn: ") and HINT_BUILD in last
    assert "cannot import name" not in last


def test_unbuilt_messages(tmp_path):
    pkg = tmp_path / "src" / "fastattn"
    (pkg / "_kernels").mkdir(parents=True)
    # an installed copy without its kernels: reinstall, no build-in-place advice
    msg = _unbuilt.unbuilt_message(str(pkg))
    assert msg.startswith("fastattn: no compiled kernels") and "--force-reinstall" in msg
    # a checkout, nothing installed
    for f in ("setup.py", "pyproject.toml"):
        (pkg.parent / f).write_text("")
    msg = _unbuilt.unbuilt_message(str(pkg))
    assert "`pip install .` and then `fastattn`" in msg and HINT_BUILD in msg
    # a build for another Python is named as such
    (pkg / "_kernels" / "_cpu.cpython-39-x86_64-linux-gnu.so").write_text("")
    if not _unbuilt.compiled_kernels_present(str(pkg)):
        assert "built for another Python" in _unbuilt.unbuilt_message(str(pkg))
    for msg in (_unbuilt.unbuilt_message(str(pkg)),
                _unbuilt.unbuilt_message(str(pkg), installed="/site/fastattn"),
                _unbuilt.unbuilt_message(str(pkg), installed="/site/fastattn", command="fastattn info")):
        assert "\n" not in msg


def test_installed_copy_is_found_past_the_tree(unbuilt_checkout):
    here = str(unbuilt_checkout / "fastattn")
    assert _unbuilt.installed_copy(here, [str(unbuilt_checkout)]) is None
    assert _unbuilt.installed_copy(here, [str(unbuilt_checkout), str(PKG.parent)]) == str(PKG)


def test_built_package_is_left_alone():
    """With the kernels present the original ImportError is the real problem."""
    assert _unbuilt.compiled_kernels_present(str(PKG))
    assert _unbuilt.raise_if_unbuilt(ImportError("something else"), str(PKG)) is None
