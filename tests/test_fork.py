"""Fork safety: a child process must not hang after the parent ran parallel kernels.

GNU libgomp keeps an idle thread pool per thread that ran a parallel region; a
fork child inherits the bookkeeping but not the threads, and its first parallel
region then waits forever.  ``fastattn._threads`` releases the pool before a
Python-level fork (see its module docstring).  Every wait here has a timeout so a
regression fails instead of hanging the test run.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import select
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import fastattn
from fastattn import _threads
from fa_testutil import child_process_env

TIMEOUT = 60
NT = 2   # explicit: forces a real OpenMP team even on a 1-CPU machine

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no fork on Windows")


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    # big enough that every kernel actually opens a parallel region
    q = rng.standard_normal((2, 4, 384, 64)).astype(np.float32)
    k = rng.standard_normal((2, 4, 384, 64)).astype(np.float32)
    v = rng.standard_normal((2, 4, 384, 64)).astype(np.float32)
    x = rng.standard_normal((1024, 512))
    return q, k, v, x


def _compute(seed=0, num_threads=NT):
    q, k, v, x = _inputs(seed)
    out = fastattn.attention(q, k, v, causal=True, num_threads=num_threads)
    sm = fastattn.softmax(x, num_threads=num_threads)
    return out, sm


def _child_job(seed):
    out, sm = _compute(seed)
    out2, _ = _compute(seed)          # twice: the pool created in the child works too
    return out, sm, bool(np.array_equal(out, out2)), fastattn.get_num_threads(), _threads.fork_state()


def _check_same(parent, child):
    np.testing.assert_allclose(child[0], parent[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(child[1], parent[1], rtol=1e-12, atol=0)
    assert child[2], "two identical calls in the child gave different results"


def _run_in_pool(method):
    ctx = mp.get_context(method)
    pool = ctx.Pool(1)
    try:
        return pool.apply_async(_child_job, (0,)).get(timeout=TIMEOUT)
    except mp.TimeoutError:
        pytest.fail(f"{method} child did not finish in {TIMEOUT}s (OpenMP pool hang after fork?)")
    finally:
        pool.terminate()
        pool.join()


@pytest.fixture
def parent_result():
    res = _compute(0)          # parallel regions run in this (the forking) thread
    _compute(0)
    return res


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork start method")
def test_multiprocessing_fork_child(parent_result):
    child = _run_in_pool("fork")
    _check_same(parent_result, child)
    _, _, _, child_threads, state = child
    if not state["forked_single_threaded"]:
        assert child_threads == fastattn.get_num_threads()
    # the parent keeps working (its pool is re-created on demand)
    _check_same(parent_result, _compute(0) + (True,))


def test_multiprocessing_spawn_child(parent_result):
    child = _run_in_pool("spawn")
    _check_same(parent_result, child)
    assert child[4]["forked_single_threaded"] is False


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_raw_os_fork_child(parent_result):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # child: never return into pytest
        code = 1
        try:
            os.close(r)
            data = pickle.dumps(_child_job(0))
            with os.fdopen(w, "wb") as f:
                f.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks, deadline = [], time.monotonic() + TIMEOUT
    try:
        with os.fdopen(r, "rb") as f:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([f], [], [], left)[0]:
                    pytest.fail(f"os.fork child did not finish in {TIMEOUT}s")
                chunk = os.read(f.fileno(), 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        _, status = os.waitpid(pid, 0)
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    _check_same(parent_result, pickle.loads(b"".join(chunks)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_fallback_single_thread_child_when_pool_release_fails():
    # Simulate a runtime whose pool cannot be released: the child must then run
    # single-threaded (and not hang), and the parent is unaffected.
    code = textwrap.dedent("""
        import multiprocessing as mp, sys
        import numpy as np
        import fastattn
        from fastattn import _threads
        _threads._pause_libgomp = lambda: False
        x = np.random.default_rng(0).standard_normal((1024, 512))
        ref = fastattn.softmax(x, num_threads=2)

        def job():
            y = fastattn.softmax(x, num_threads=2)
            return fastattn.get_num_threads(), _threads.resolve_num_threads(4), \\
                _threads.fork_state(), bool(np.allclose(y, ref, rtol=1e-12))

        if __name__ == "__main__":
            with mp.get_context("fork").Pool(1) as pool:
                n, n4, st, same = pool.apply_async(job).get(timeout=60)
            opened_team = st["last_fork"] == "failed"
            assert same, "child result differs"
            if opened_team:
                assert st["forked_single_threaded"] and n == 1 and n4 == 1, (n, n4, st)
            assert fastattn.get_num_threads() >= 1 and _threads.resolve_num_threads(3) == 3
            print("ok", st["last_fork"])
    """)
    env, cwd = child_process_env()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=cwd, timeout=TIMEOUT + 30)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("ok failed"), res.stdout
