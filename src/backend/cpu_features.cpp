#include "backend/cpu_features.h"

#include <string>

namespace dsv4 {

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2");
    c.fma = __builtin_cpu_supports("fma");
    c.f16c = __builtin_cpu_supports("f16c");
    c.avx512f = __builtin_cpu_supports("avx512f");
    c.avx512bw = __builtin_cpu_supports("avx512bw");
    c.avx512vl = __builtin_cpu_supports("avx512vl");
    c.avx512vbmi = __builtin_cpu_supports("avx512vbmi");
#endif
    return c;
  }();
  return f;
}

const char* cpu_features_string() {
  static const std::string s = [] {
    const CpuFeatures& c = cpu_features();
    std::string r;
    auto add = [&](bool on, const char* name) {
      if (!on) return;
      if (!r.empty()) r += ' ';
      r += name;
    };
    add(c.avx2, "avx2");
    add(c.fma, "fma");
    add(c.f16c, "f16c");
    add(c.avx512f, "avx512f");
    add(c.avx512bw, "avx512bw");
    add(c.avx512vl, "avx512vl");
    add(c.avx512vbmi, "avx512vbmi");
    if (r.empty()) r = "(none)";
    return r;
  }();
  return s.c_str();
}

}  // namespace dsv4
