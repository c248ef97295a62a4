"""Ctrl-C: a long attention, backward or softmax call stops soon with KeyboardInterrupt.

The calling thread checks for signals between work units (every 50 ms of a
long call) and the team abandons the remaining units; the call raises, so no
half-written result is returned.  A child process runs the long call and the
test sends it SIGINT.
"""
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from fa_testutil import child_process_env

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is POSIX")

CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np, fastattn
    which, threads = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(0)
    if which == "attention":
        q = rng.standard_normal((1, 8, 16384, 128), dtype=np.float32)   # ~10 s of work on one core
        out = np.zeros_like(q)
        call = lambda: fastattn.attention(q, q, q, out=out, num_threads=threads)
    elif which == "backward":
        q = 0.1 * rng.standard_normal((1, 4, 16384, 64), dtype=np.float32)  # ~5 s of work on one core
        lse = np.full(q.shape[:-1], np.log(q.shape[-2]), dtype=np.float32)
        call = lambda: fastattn.attention_backward(q, q, q, q, q, lse, num_threads=threads)
    else:
        x = np.zeros((1 << 11, 1 << 18), dtype=np.float32)               # 2 GiB of softmax rows
        # out= touched first: a new 2 GiB result's first writes are page faults
        # (the OS zeroing huge pages), seconds in one column unit, not fastattn's work
        out = np.ones_like(x)
        axis = 0 if which == "softmax_columns" else -1
        call = lambda: [fastattn.softmax(x, axis=axis, out=out, num_threads=threads) for _ in range(50)]
    print("ready", flush=True)
    try:
        call()
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


def _interrupt(which, threads):
    env, cwd = child_process_env()
    p = subprocess.Popen([sys.executable, "-c", CHILD, which, str(threads)], stdout=subprocess.PIPE,
                         text=True, env=env, cwd=cwd)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        t = time.perf_counter()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline().strip()
        elapsed = time.perf_counter() - t
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    return line, elapsed


@pytest.mark.parametrize("threads", [1, 2])
def test_ctrl_c_stops_a_long_attention_call(threads):
    line, elapsed = _interrupt("attention", threads)
    assert line == "interrupted"
    assert elapsed < 1.0, f"KeyboardInterrupt {elapsed:.2f} s after SIGINT"


@pytest.mark.parametrize("which", ["softmax", "softmax_columns"])
def test_ctrl_c_stops_a_long_softmax_call(which):
    line, elapsed = _interrupt(which, 2)
    assert line == "interrupted"
    assert elapsed < 1.0, f"KeyboardInterrupt {elapsed:.2f} s after SIGINT"


@pytest.mark.parametrize("threads", [1, 2])
def test_ctrl_c_stops_a_long_backward_call(threads):
    line, elapsed = _interrupt("backward", threads)
    assert line == "interrupted"
    assert elapsed < 1.0, f"KeyboardInterrupt {elapsed:.2f} s after SIGINT"
