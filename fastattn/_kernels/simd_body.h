/* One body for the float and double kernels, included twice by simd.h with
 * FA_T (element type), FA_V / FA_VI (vector and same-width integer vector),
 * FA_SFX (name suffix) and the exp constants defined.  Not a standalone header.
 * Each part holds one job; see README.md in this directory for the map. */

#define FA_W ((int)(FA_VBYTES / sizeof(FA_T)))        /* lanes per vector */
#define FA_QK_NR (FA_QK_NV * FA_W)                      /* columns per QK panel */
#define FA_QK_PAIRS (FA_QK_PAIRS_W * FA_W)              /* accumulators of fa_qk_pass */

#include "vec_core.h"
#include "vec_exp.h"
#include "softmax_cols.h"
/* the readers of stored q, k, v, once per storage type (FA_S) of this compute
 * type; the native storage keeps the compute type's names (fa_qk_rows_f ...) */
#define FA_S FA_T
#define FA_SSFX(name) FA_SFX(name)
#define FA_S_NATIVE 1
#include "widen.h"
#include "stored_reads.h"
#undef FA_S_NATIVE
#undef FA_SSFX
#undef FA_S
#ifndef FA_DOUBLE
/* float compute: half-precision, int8 and float8 storage (double compute reads only doubles) */
#define FA_S uint16_t
#define FA_SSFX(name) name##_fh
#define FA_S_F16 1
#include "widen.h"
#include "stored_reads.h"
#undef FA_S_F16
#undef FA_SSFX
#define FA_SSFX(name) name##_fb
#define FA_S_BF16 1
#include "widen.h"
#include "stored_reads.h"
#undef FA_S_BF16
#undef FA_SSFX
#undef FA_S
#define FA_S int8_t
#define FA_SSFX(name) name##_fi8
#define FA_S_I8 1
#include "widen.h"
#include "stored_reads.h"
#undef FA_S_I8
#undef FA_SSFX
#undef FA_S
/* float8 (ml_dtypes float8_e4m3fn, float8_e5m2): bytes */
#define FA_S uint8_t
#define FA_SSFX(name) name##_fe4
#define FA_S_F8E4 1
#include "widen.h"
#include "stored_reads.h"
#undef FA_S_F8E4
#undef FA_SSFX
#define FA_SSFX(name) name##_fe5
#define FA_S_F8E5 1
#include "widen.h"
#include "stored_reads.h"
#undef FA_S_F8E5
#undef FA_SSFX
#undef FA_S
#endif
#include "quant_reads.h"
#include "tile_kernels.h"
#include "qvec_kernels.h"

#undef FA_W
#undef FA_QK_NR
#undef FA_QK_PAIRS
