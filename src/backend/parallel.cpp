#include "backend/parallel.h"

#include <omp.h>

namespace dsv4 {

int max_threads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

void set_num_threads(int n) { omp_set_num_threads(n > 0 ? n : omp_get_num_procs()); }

}  // namespace dsv4
