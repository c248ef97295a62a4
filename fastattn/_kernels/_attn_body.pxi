# The kernel module shared by every ISA variant: _attn_baseline.pyx, _attn_avx2.pyx
# and _attn_avx512.pyx include this file, and setup.py compiles each with its own
# -march flags.  One job per part; README.md in this directory draws the map.
include "declarations.pxi"
include "plan.pxi"
include "typed_kernels.pxi"
include "workspace.pxi"
include "loads.pxi"
include "score_options.pxi"
include "row_unit.pxi"
include "qvec_unit.pxi"
include "split_merge.pxi"
include "driver.pxi"
include "arguments.pxi"
include "attention_entry.pxi"
include "softmax.pxi"
include "backward.pxi"
include "backward_entry.pxi"
