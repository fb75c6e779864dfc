// Launchers of the fused neighbour ops of a decode step (k_fused.cu): each queues one kernel where the shapes allow
// it (else the launchers of the ops it stands for, kernels.h), with the result of the op sequence bitwise. The
// semantics are those of the Ops method of the same name (backend/ops.h); every pointer is device memory.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/ops.h"

namespace dsv4::cuda {

// Ops::norm_rope_fp8: rmsnorm, rope, fp8_sim (bf16) of each row, then the stores (n_store of them, store_src[i] <
// n_rows); one kernel for rows of <= 1024 floats (the width rmsnorm() gives a warp per row), 16-byte aligned, with
// the stores inside for up to 64 entries (else a scatter_rows launch after it).
void norm_rope_fp8(float* x, int64_t n_rows, int64_t dim, const float* w, float eps, int64_t rd, const float* cos_sin,
                   bool bf16, const int32_t* store_src, float* store, const int32_t* store_dst, int64_t n_store,
                   cudaStream_t stream);
// Ops::rope_hadamard_fp4: one kernel for head rows of a power of two 64..8192 floats (hadamard's width limits).
void rope_hadamard_fp4(float* x, int64_t n_tok, int64_t n_heads, int64_t dim, int64_t rd, const float* cos_sin,
                       cudaStream_t stream);
// Ops::frontier_update: one kernel when n <= 32 (decode), the ape add inside it when n_tok <= 32 too (else an add_rows
// launch first); more rows: a gather and a scatter launch through scratch `tmp` of frontier_update_scratch_bytes(...)
// bytes (nullptr when that is 0).
size_t frontier_update_scratch_bytes(int64_t n_tok, int64_t n, int64_t dim);
void frontier_update(const float* kv, float* score, int64_t n_tok, const float* ape, const int32_t* ape_row,
                     float* state_kv, float* state_score, const int32_t* idx, const int32_t* dst, int64_t n,
                     int64_t dim, float* tmp, cudaStream_t stream);

// Ops::sparse_attention_rope (k_attention.cu): sparse_attention (kernels.h; split_scratch as there), then the inverse
// rope of out (rd = 0: none): inside the split mode's combine kernel (decode), else a rope launch after.
void sparse_attention_rope(const float* q, int64_t n_tok, int64_t n_heads, const KvRows& kv, const int32_t* win_idx,
                           int64_t k_win, const int32_t* comp_idx, int64_t k_comp, const float* sink, float scale,
                           bool bf16, int64_t rd, const float* cos_sin, float* out, void* split_scratch,
                           size_t split_bytes, cudaStream_t stream);

}  // namespace dsv4::cuda
