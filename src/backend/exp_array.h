// Element-wise exponential of an array, bitwise equal to std::exp(float) of the C library the program runs with.
//
// The CPU ops' softmaxes and SwiGLU take std::exp per element (the reference numerics are those of the C library's
// expf). One call per element cost ~8% of a demo-model prefill; exp_array computes 8 elements per step where it can
// prove the results equal: on x86-64 with AVX2 + FMA, glibc's expf is __expf_fma (its ifunc choice on such CPUs),
// whose operations this file repeats lane-wise in the same order with the same constants (a 32-entry table of
// 2^(i/32) and a cubic in double precision, fused multiply-adds where __expf_fma has them); inputs with |x| >= 88,
// infinities and NaN go through std::exp itself. The vector path is used only when a self-check at first use agrees
// with std::exp on every one of ~200,000 inputs (dense over the range where exp is neither 0 nor inf, plus random
// bit patterns); otherwise (another C library, no AVX2 / FMA) every element calls std::exp.
#pragma once
#include <cstdint>

namespace dsv4 {

// y[i] = std::exp(x[i]) for i < n, bitwise; y may be x.
void exp_array(const float* x, int64_t n, float* y);

// Whether exp_array runs its vector path on this machine (tests, logs).
bool exp_array_vectorized();

}  // namespace dsv4
