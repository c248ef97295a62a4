"""examples/train_tiny_transformer.py: a shortened run learns (its loss falls)."""
import importlib.util
import os

import numpy as np
import pytest

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                       "train_tiny_transformer.py")

if not os.path.exists(EXAMPLE):     # tests copied out of the checkout (wheel checks)
    pytest.skip(f"no {EXAMPLE}", allow_module_level=True)


def _example():
    spec = importlib.util.spec_from_file_location("train_tiny_transformer", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_loss_falls():
    losses = _example().train(steps=60, verbose=False)
    # log(vocab) = 3.2 at the start; reversing is learnt within a few dozen steps
    assert losses[0] > 2.5
    assert np.mean(losses[-10:]) < 0.5 * losses[0]
    assert np.mean(losses[-10:]) < 0.3


def test_model_gradient_matches_finite_differences():
    """The hand-written backward of the example's model (fastattn's attention
    gradients inside) against central differences of its loss, in float64."""
    ex = _example()
    rng = np.random.default_rng(1)
    p = {n: w.astype(np.float64) for n, w in ex.init_params(rng, 7, 6, 16).items()}
    x = rng.integers(0, 7, size=(3, 6))
    _, g = ex.loss_and_grads(p, x, x[:, ::-1], 2, 1)
    h = 1e-5
    for name, w in p.items():
        for _ in range(6):
            idx = tuple(rng.integers(0, n) for n in w.shape)
            old = w[idx]
            w[idx] = old + h
            lp = ex.loss_and_grads(p, x, x[:, ::-1], 2, 1)[0]
            w[idx] = old - h
            lm = ex.loss_and_grads(p, x, x[:, ::-1], 2, 1)[0]
            w[idx] = old
            fd = (lp - lm) / (2 * h)
            assert abs(fd - g[name][idx]) <= 1e-8 + 1e-6 * abs(fd), (name, idx, fd, g[name][idx])
