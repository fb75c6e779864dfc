// Threading helpers over the OpenMP pool. Work is split statically (deterministic assignment of items to threads);
// callers keep every output element computed by exactly one thread, so results never depend on the thread count.
#pragma once
#include <cstdint>

namespace dsv4 {

// Threads a parallel region would use now (omp_get_max_threads(); 1 inside an active parallel region).
int max_threads();
// Set the pool size for subsequent parallel regions (omp_set_num_threads; n <= 0: all hardware threads).
void set_num_threads(int n);

// Calls fn(i) for i in [0, n) with a static partition over the pool. fn must not throw.
template <typename Fn>
void parallel_for(int64_t n, Fn&& fn) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

// Calls fn(i) for i in [0, n), each on a thread of its own when the pool has n threads (else a thread runs several,
// one after the other). fn must not throw.
template <typename Fn>
void parallel_tasks(int n, Fn&& fn) {
#pragma omp parallel for schedule(static, 1) num_threads(n)
  for (int i = 0; i < n; ++i) fn(i);
}

}  // namespace dsv4
