// The AVX-512 GEMM kernels (gemm_avx512.cpp) compiled once more with AVX512-VBMI: avx512vbmi_kernels(), the kernel
// set of SimdLevel::avx512vbmi, chosen at run time on CPUs that have VBMI (Ice Lake / Sapphire Rapids, Zen 4).
// Everything is the AVX-512 code; only where gemm_avx512.cpp tests kVbmi (the quantized FP8 GEMVs' E4M3 decode
// through byte tables) does it differ, with the same results, bitwise.
#define DSV4_GEMM_AVX512_VBMI 1
#include "backend/gemm_avx512.cpp"  // NOLINT(bugprone-suspicious-include): one source, two target sets
