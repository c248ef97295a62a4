"""Ctrl-C: a long attention, packed / paged, backward or softmax call stops soon with KeyboardInterrupt.

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
    import signal, sys, time
    # Python's own SIGINT handler even when the child starts with SIGINT ignored
    # (what a non-interactive shell does to a command it starts in the background)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import numpy as np, fastattn
    which, threads = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(0)
    if which == "attention":
        q = rng.standard_normal((1, 8, 16384, 128), dtype=np.float32)   # ~10 s of work on one core
        out = np.zeros_like(q)
        call = lambda: fastattn.attention(q, q, q, out=out, num_threads=threads)
    elif which in ("varlen", "paged"):
        # two long sequences packed (~10 s of work on one core), or their paged decode
        q = rng.standard_normal((8, 2 * 8192, 128), dtype=np.float32)
        cu = np.array([0, 8192, 16384])
        if which == "varlen":
            call = lambda: fastattn.attention_varlen(q, q, q, cu, num_threads=threads)
        else:
            cache = rng.standard_normal((1024, 8, 256, 128), dtype=np.float32)   # 1 GiB, 256 Ki keys
            table = np.arange(1024).reshape(2, 512)
            qd = q[:, :4096]                                                      # ~10 s on one core
            cu = np.array([0, 2048, 4096])
            call = lambda: fastattn.attention_paged(qd, cache, cache, table, np.array([131072, 131072]),
                                                    cu_seqlens_q=cu, num_threads=threads)
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


@pytest.mark.parametrize("which", ["varlen", "paged"])
@pytest.mark.parametrize("threads", [1, 2])
def test_ctrl_c_stops_a_long_packed_or_paged_call(which, threads):
    line, elapsed = _interrupt(which, threads)
    assert line == "interrupted"
    assert elapsed < 1.0, f"KeyboardInterrupt {elapsed:.2f} s after SIGINT"
