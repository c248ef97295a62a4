"""Thread-count control: set/get/threads(), validation, OMP_NUM_THREADS, cgroups,
threadpoolctl interplay."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest

import fastattn
from fastattn import _threads
from fa_testutil import child_process_env


@pytest.fixture(autouse=True)
def _restore_setting():
    fastattn.set_num_threads(None)
    yield
    fastattn.set_num_threads(None)


def _run_py(code: str, env_update=None, timeout=120) -> str:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env.update(env_update or {})
    env, cwd = child_process_env(env)
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


# --------------------------------------------------------------------------- basics

def test_default_is_effective_num_threads():
    n = fastattn.get_num_threads()
    assert isinstance(n, int) and n >= 1
    assert n == _threads.effective_num_threads()
    assert n <= _threads.cpu_count_available() or "OMP_NUM_THREADS" in os.environ
    assert _threads.resolve_num_threads(None) == n


def test_set_get_roundtrip():
    fastattn.set_num_threads(3)
    assert fastattn.get_num_threads() == 3
    assert _threads.resolve_num_threads(None) == 3
    assert _threads.resolve_num_threads(1) == 1          # per-call value wins
    fastattn.set_num_threads(np.int64(2))                # numpy integers accepted
    assert fastattn.get_num_threads() == 2 and type(fastattn.get_num_threads()) is int
    fastattn.set_num_threads(None)
    assert fastattn.get_num_threads() == _threads.effective_num_threads()


def test_threads_context_manager_nests_and_restores():
    fastattn.set_num_threads(2)
    with fastattn.threads(5) as n:
        assert n == 5 and fastattn.get_num_threads() == 5
        with fastattn.threads(1) as m:
            assert m == 1 and _threads.resolve_num_threads(None) == 1
        assert fastattn.get_num_threads() == 5
        with fastattn.threads(None):                      # back to the default inside
            assert fastattn.get_num_threads() == 2
    assert fastattn.get_num_threads() == 2
    with pytest.raises(RuntimeError):
        with fastattn.threads(4):
            raise RuntimeError("boom")
    assert fastattn.get_num_threads() == 2


def test_threads_context_is_per_python_thread():
    fastattn.set_num_threads(2)
    seen = {}
    inside = threading.Event()
    release = threading.Event()

    def other():
        inside.wait(10)
        seen["other"] = fastattn.get_num_threads()
        with fastattn.threads(3):
            seen["other_inner"] = fastattn.get_num_threads()
            release.set()

    t = threading.Thread(target=other)
    t.start()
    with fastattn.threads(7):
        inside.set()
        release.wait(10)
        seen["main"] = fastattn.get_num_threads()
    t.join(10)
    assert seen == {"other": 2, "other_inner": 3, "main": 7}


@pytest.mark.parametrize("bad, exc", [
    (0, ValueError), (-1, ValueError), (np.int32(0), ValueError), (2**40, ValueError),
    (1.5, TypeError), (2.0, TypeError), (True, TypeError), (np.bool_(True), TypeError),
    ("2", TypeError), ([2], TypeError),
])
def test_bad_values_rejected(bad, exc):
    with pytest.raises(exc, match="num_threads"):
        _threads.resolve_num_threads(bad)
    with pytest.raises(exc, match="num_threads"):
        fastattn.set_num_threads(bad)
    with pytest.raises(exc, match="num_threads"):
        with fastattn.threads(bad):
            pass
    assert fastattn.get_num_threads() == _threads.effective_num_threads()


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (1.5, TypeError), (True, TypeError)])
def test_public_calls_validate_num_threads(bad, exc):
    x = np.ones((4, 8), dtype=np.float32)
    with pytest.raises(exc, match="num_threads"):
        fastattn.softmax(x, num_threads=bad)
    with pytest.raises(exc, match="num_threads"):
        fastattn.log_softmax(x, num_threads=bad)
    q = np.ones((2, 4, 8), dtype=np.float32)
    with pytest.raises(exc, match="num_threads"):
        fastattn.attention(q, q, q, num_threads=bad)


def test_results_independent_of_thread_count():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((4, 2, 96, 32)).astype(np.float32) for _ in range(3))
    x = rng.standard_normal((300, 257))
    a1 = fastattn.attention(q, k, v, causal=True, num_threads=1)
    s1 = fastattn.softmax(x, num_threads=1)
    for n in (2, 3):
        np.testing.assert_allclose(fastattn.attention(q, k, v, causal=True, num_threads=n), a1,
                                   rtol=1e-6, atol=1e-7)
        with fastattn.threads(n):
            np.testing.assert_allclose(fastattn.softmax(x), s1, rtol=1e-13, atol=0)


# --------------------------------------------------------------------------- environment

def test_omp_num_threads_honoured_in_subprocess():
    code = """
        import fastattn
        print(fastattn.get_num_threads())
    """
    assert _run_py(code, {"OMP_NUM_THREADS": "1"}) == "1"
    assert _run_py(code, {"OMP_NUM_THREADS": "1,1"}) == "1"          # nested list form
    default = int(_run_py(code))
    assert default == min(_threads.cpu_count_available(), default)
    # garbage is ignored: the default, and the variable removed before any OpenMP
    # runtime reads it (LLVM libomp 14 aborts on "lots"), with a warning
    check = """
        import os, warnings
        warnings.simplefilter("error", RuntimeWarning)
        try:
            import fastattn
        except RuntimeWarning as w:
            assert "OMP_NUM_THREADS" in str(w), w
            warnings.simplefilter("ignore", RuntimeWarning)
            import fastattn
        else:
            raise AssertionError("no RuntimeWarning")
        print(fastattn.get_num_threads(), "OMP_NUM_THREADS" in os.environ)
    """
    for bad in ("lots", "0", "-2", "4,x"):
        assert _run_py(check, {"OMP_NUM_THREADS": bad}) == f"{default} False", bad


# OMP_NUM_THREADS values and what they mean by the documented rule (docs/guide.rst
# "Threads", fastattn/_threads.py's docstring): a comma-separated list of positive
# integers (blanks around an entry allowed) asks for its first entry and stays in the
# environment; an unset or blank value asks for nothing; any other value is ignored
# (_omp_num_threads_env() gives None) and removed by `import fastattn` with a
# RuntimeWarning.  (value, _omp_num_threads_env(), removed at import)
_BIG = "9" * 5000          # more digits than int() converts (sys.get_int_max_str_digits())
_OMP_VALUES = [
    (None, None, False), ("", None, False), ("  ", None, False), ("\t\n", None, False),
    ("2", 2, False), (" 2 ", 2, False), ("\t2\n", 2, False), ("007", 7, False),
    ("2,1", 2, False), ("4,2,1", 4, False), (" 4 , 2 ", 4, False),
    ("99999999999999999999", 99999999999999999999, False),   # capped by the usable CPUs
    ("0", None, True), ("00", None, True), ("-1", None, True), ("lots", None, True),
    ("1.5", None, True), ("2.0", None, True), ("0x10", None, True), ("1e3", None, True),
    ("3 4", None, True), ("2;1", None, True), (",2", None, True), ("x,2", None, True),
    ("0,2", None, True), ("x,\u00b2", None, True), ("0," + _BIG, None, True),
    ("2,", None, True), ("2,,1", None, True), ("2,x", None, True), ("2,0", None, True),
    ("2,-1", None, True), ("+3", None, True), ("+3,1", None, True), ("1_000", None, True),
    ("\u0663", None, True), ("\uff12", None, True),
    ("\u00b2", None, True), ("\u00b2,x", None, True), ("2,\u00b2", None, True), (_BIG, None, True),
]
@pytest.mark.parametrize("raw, first, removed", _OMP_VALUES,
                         ids=[repr(v) if v is None or len(v) < 12 else f"{v[:4]}...({len(v)})"
                              for v, _, _ in _OMP_VALUES])
def test_omp_num_threads_values(raw, first, removed, monkeypatch):
    if raw is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", raw)
    assert _threads._omp_num_threads_env() == first
    parsed = _threads._parse_omp_num_threads(raw)
    assert (parsed.first, parsed.valid) == (first, not removed)
    if removed:
        with pytest.warns(RuntimeWarning, match="is not a list of positive integers"):
            _threads._drop_invalid_omp_num_threads()
        assert "OMP_NUM_THREADS" not in os.environ
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _threads._drop_invalid_omp_num_threads()
        assert os.environ.get("OMP_NUM_THREADS") == raw


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity API")
def test_cpu_affinity_honoured_in_subprocess():
    code = """
        import os
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        from fastattn import _threads
        _threads.refresh_cpu_info()
        print(_threads.cpu_count_available())
    """
    assert _run_py(code) == "1"


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota(tmp_path):
    root = tmp_path
    _write(root / "proc/self/cgroup", "0::/user.slice/job\n")
    _write(root / "proc/self/mountinfo",
           "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    _write(root / "sys/fs/cgroup/cpu.max", "max 100000\n")
    _write(root / "sys/fs/cgroup/user.slice/cpu.max", "300000 100000\n")
    _write(root / "sys/fs/cgroup/user.slice/job/cpu.max", "150000 100000\n")   # 1.5 -> 2
    assert _threads._cgroup_cpu_limit(str(root)) == 2
    _write(root / "sys/fs/cgroup/user.slice/job/cpu.max", "max 100000\n")
    assert _threads._cgroup_cpu_limit(str(root)) == 3                    # parent's limit
    _write(root / "sys/fs/cgroup/user.slice/cpu.max", "max 100000\n")
    assert _threads._cgroup_cpu_limit(str(root)) is None


def test_cgroup_v1_quota_with_bind_mounted_root(tmp_path):
    root = tmp_path
    # docker without a cgroup namespace: host path in /proc/self/cgroup, the
    # container's directory bind-mounted at /sys/fs/cgroup/cpu,cpuacct
    _write(root / "proc/self/cgroup", "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n")
    _write(root / "proc/self/mountinfo",
           "40 30 0:35 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n")
    _write(root / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "400000\n")
    _write(root / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    assert _threads._cgroup_cpu_limit(str(root)) == 4
    _write(root / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    assert _threads._cgroup_cpu_limit(str(root)) is None


def test_cgroup_fixed_path_fallback(tmp_path):
    root = tmp_path
    _write(root / "sys/fs/cgroup/cpu.max", "50000 100000\n")            # 0.5 CPU -> 1
    assert _threads._cgroup_cpu_limit(str(root)) == 1


def test_cgroup_limit_on_this_machine_is_sane():
    lim = _threads._cgroup_cpu_limit()
    assert lim is None or lim >= 1


# --------------------------------------------------------------------------- OpenMP runtime

def _kernels_use_openmp() -> bool:
    from fastattn._kernels import _cpu

    return bool(_cpu.openmp_enabled())


def test_omp_max_threads_hook_present():
    from fastattn._kernels import _cpu

    assert _cpu.omp_max_threads() >= 1
    assert _threads._omp_max_threads() == _cpu.omp_max_threads()


def test_threadpoolctl_sees_our_openmp_runtime():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not _kernels_use_openmp():
        pytest.skip("kernels built without OpenMP")
    import fastattn._kernels._cpu  # noqa: F401  (loads the OpenMP runtime)

    info = threadpoolctl.threadpool_info()
    assert any(d["user_api"] == "openmp" for d in info), info


def test_threadpool_limits_lowers_default():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not _kernels_use_openmp():
        pytest.skip("kernels built without OpenMP")
    before = fastattn.get_num_threads()
    with threadpoolctl.threadpool_limits(1, user_api="openmp"):
        assert fastattn.get_num_threads() == 1
        assert _threads.resolve_num_threads(None) == 1
        # explicit values are used as given (documented precedence)
        assert _threads.resolve_num_threads(2) == 2
        with fastattn.threads(2):
            assert fastattn.get_num_threads() == 2
        x = np.random.default_rng(1).standard_normal((64, 64))
        np.testing.assert_allclose(fastattn.softmax(x), fastattn.softmax(x, num_threads=1),
                                   rtol=1e-13)
    assert fastattn.get_num_threads() == before


def test_fork_state_reports():
    st = _threads.fork_state()
    assert set(st) == {"mitigation", "last_fork", "forked_single_threaded"}
    assert st["forked_single_threaded"] is False
