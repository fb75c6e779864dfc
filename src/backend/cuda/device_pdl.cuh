// Programmatic Dependent Launch (PDL, sm_90+) for the kernels of a decode step: a kernel launched through
// launch_pdl() may be scheduled while the kernel before it in the stream still runs (once that kernel has called
// pdl_launch_dependents() in every block, or exited), so its blocks are resident and its constant loads (weights,
// scales) in flight when the predecessor finishes, instead of paying a launch gap. Inside stream capture the
// attribute becomes a programmatic edge of the recorded graph. It changes scheduling only: results stay bitwise
// the same (the switch: kernels.h set_pdl, the CLI's --no-pdl).
//
// Rules for a kernel launched through launch_pdl():
//  1. Every thread calls pdl_wait() before its first read of anything an earlier kernel wrote (activations, plans,
//     state rows, scratch) AND before its first global write (an earlier kernel may still read the buffer it is
//     about to overwrite). pdl_wait() returns once every prerequisite grid has completed and its memory is
//     visible. Only reads of constant data (weights, weight scales, tables uploaded before the step) may come first.
//  2. Every thread calls pdl_wait() before it exits, even a thread with nothing to do (put it before any early
//     return): the kernel after this one waits for this one's completion only, so this kernel must not complete
//     before its own predecessor did.
//  3. Atomics and flags are global writes (rule 1). A kernel that spins on a flag another grid sets, a cooperative
//     launch, and kernels we do not own (cuBLAS / cuBLASLt) are not launched through launch_pdl().
// A kernel launched the ordinary way (<<<...>>>) needs none of this: it starts after its predecessor completed;
// pdl_wait() in it returns at once. Memory copies, memsets, event waits and graph launches between kernels stay
// full dependencies.
// pdl_launch_dependents() may be called anywhere (also in a kernel launched the ordinary way): it only lets the next
// kernel be scheduled early, whose pdl_wait() still waits for this kernel's completion. The decode-path kernels call
// it right after their pdl_wait(), so the next kernel's blocks get onto the SMs while this one works (one kernel
// ahead: the kernel after the next is scheduled only once the next one passed its own pdl_wait()).
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/kernels.h"

namespace dsv4::cuda {

// Wait until the grids this one depends on have completed and their writes are visible (griddepcontrol.wait).
// A no-op below sm_90 and in a kernel launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Let the next kernel in the stream be scheduled before this one completes (griddepcontrol.launch_dependents).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic stream serialization attribute when
// pdl_active() (the switch on and the current device sm_90+). Launch errors surface through cudaGetLastError(), as
// for <<<...>>>.
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  if (!pdl_active()) {
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    return;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);  // an error is also cudaGetLastError()'s
}

}  // namespace dsv4::cuda
