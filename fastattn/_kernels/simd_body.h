/* One body for the float and double kernels, included twice by simd.h with
 * FA_T (element type), FA_V / FA_VI (vector and same-width integer vector),
 * FA_SFX (name suffix) and the exp constants defined.  Not a standalone header.
 * Each part holds one job; see README.md in this directory for the map. */

#define FA_W ((int)(FA_VBYTES / sizeof(FA_T)))        /* lanes per vector */
#define FA_QK_NR (FA_QK_NV * FA_W)                      /* columns per QK panel */

#include "vec_core.h"
#include "vec_exp.h"
#include "softmax_cols.h"
#include "stored_reads.h"
#include "tile_kernels.h"
#include "qvec_kernels.h"

#undef FA_W
#undef FA_QK_NR
