"""Draw the figures of the docs that are computed, not measured.

    python docs/make_figures.py          # needs fastattn (built or installed) and matplotlib

writes ``docs/figures/attention-weights.png``: the walkthrough's heatmap, the
attention weights of the query "it" against the keys "trophy", "suitcase" and
"it" (raw dot products 16, 8 and 0, d_k = 64) under three scalings, computed
by ``fastattn.attention``.  The PNG is committed (about 30 KB), so building the
docs needs neither this script nor matplotlib; rerun it when the figure should
change.  The plots of ``bench/compare.py`` runs are measured and live beside it.
"""
import os
import sys

import numpy as np

WORDS = ("trophy", "suitcase", "it")
DK = 64
# (label, scale): none, the formula's 1/sqrt(d_k), and the too-flat 1/d_k
SCALINGS = (("no scaling", 1.0), ("÷ √d_k = 8", 1 / np.sqrt(DK)), ("÷ d_k = 64", 1 / DK))
# the weights the lesson prints for 1/sqrt(d_k), rounded
LESSON_WEIGHTS = np.array([0.665241, 0.244728, 0.090031])


def lesson_inputs():
    """q (1, 64), k (3, 64), v (3, 2) with q . k = [16, 8, 0] exactly."""
    q = np.full((1, DK), 0.5)
    k = np.zeros((3, DK))
    k[0] = 0.5                                              # 64 * 0.25 = 16
    k[1, : DK // 2] = 0.5                                   # 32 * 0.25 = 8
    k[2] = np.where(np.arange(DK) % 2 == 0, 0.5, -0.5)      # products cancel: 0
    v = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    return q, k, v


def weights_per_scaling():
    """(3, 3) array: one row of attention weights per entry of SCALINGS."""
    import fastattn

    q, k, v = lesson_inputs()
    rows = [fastattn.attention(q, k, v, scale=s, return_weights=True)[1][0] for _, s in SCALINGS]
    w = np.array(rows)
    assert np.allclose(w[1], LESSON_WEIGHTS, atol=5e-7), w[1]
    return w


def draw_attention_weights(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = weights_per_scaling()
    fig, ax = plt.subplots(figsize=(6.0, 2.6), dpi=100)
    im = ax.imshow(w, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(WORDS)), [f'"{x}"' for x in WORDS])
    ax.set_yticks(range(len(SCALINGS)), [label for label, _ in SCALINGS])
    ax.set_xlabel("key")
    ax.set_title('attention weights of the query "it"\n(raw scores 16, 8, 0; d_k = 64)', fontsize=10)
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            # small weights with two significant digits: 0.00034, not 0.000
            label = f"{w[i, j]:.3f}" if w[i, j] >= 0.01 else f"{w[i, j]:.2g}"
            ax.text(j, i, label, ha="center", va="center",
                    color="white" if w[i, j] > 0.5 else "black", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.05, pad=0.04)
    fig.tight_layout()
    # no version stamp in the file: the same figure gives the same bytes
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "figures", "attention-weights.png")
    draw_attention_weights(out)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
