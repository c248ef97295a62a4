/* C micro-kernels of the attention backward (backward.pxi), float and double
 * from one body (backward_body.h) included twice, as simd.h does with
 * simd_body.h.  Built on simd.h's vector types, loads, exp and transposes. */
#ifndef FASTATTN_BACKWARD_KERNELS_H
#define FASTATTN_BACKWARD_KERNELS_H

#include "simd.h"

#define FA_T float
#define FA_SFX(name) name##_f
#define FA_V fa_v_f
#define FA_VI fa_vi_f
#include "backward_body.h"
#undef FA_T
#undef FA_SFX
#undef FA_V
#undef FA_VI

#define FA_T double
#define FA_SFX(name) name##_d
#define FA_V fa_v_d
#define FA_VI fa_vi_d
#include "backward_body.h"
#undef FA_T
#undef FA_SFX
#undef FA_V
#undef FA_VI

#endif /* FASTATTN_BACKWARD_KERNELS_H */
