// The host / device timeline of an unsynchronized step (backend/timeline_ops.h) on CUDA: a prefill of 512 tokens of
// 2 dummy V4-Flash layers with a timing event after every op on its stream (the branch's ops on the second stream):
// one row per op in order, device ends in order along each stream and after what each op follows (the branch's fork
// and join), the logits bitwise those of the untraced prefill (the same kernels run), and `dsv4 bench model
// --timeline FILE` writes the rows and reports the summary.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/replica.h"
#include "common/timeline_check.h"
#include "gpu_cli.h"
#include "gpu_test_util.h"
#include "model/dummy_weights.h"
#include "model/model.h"
#include "model/sequence.h"

namespace dsv4::test::gpu {
namespace {

TEST(CudaTimeline, FlashPrefillRowsInOrderAndLogitsUnchanged) {
  DSV4_REQUIRE_GPU();
  const ModelConfig cfg = keep_first_layers(load_config(testing::configs_dir() / "deepseek-v4-flash-config.json"), 2);
  std::unique_ptr<Backend> be = make_backend(Device{DeviceKind::cuda, 0});
  ModelOptions o;
  o.backend = be.get();
  o.ubatch = 512;  // the 512 tokens in one forward step (the default ubatch, 256, makes two)
  std::unique_ptr<Model> m = Model::load_dummy(cfg, o);
  const auto ids = random_ids(512, m->n_vocab(), 5);
  const std::vector<float> plain = timeline_prefill(*m, ids);

  TimelineOps tl(*be, 64);  // (fewer markers reserved than ops: the rest are made when first marked)
  m->set_op_hook(&tl);
  std::vector<float> traced;
  double end = 0;
  for (int rep = 0; rep < 2; ++rep) {  // the second run reuses the events made by the first
    tl.start();
    traced = timeline_prefill(*m, ids);
    end = Backend::timeline_clock();
    tl.finish();
    check_timeline(tl, end, "V4-Flash 2 layers, 512 tokens, run " + std::to_string(rep));
  }
  m->set_op_hook(nullptr);
  ASSERT_EQ(plain.size(), traced.size());
  EXPECT_EQ(std::memcmp(plain.data(), traced.data(), plain.size() * 4), 0) << "the traced prefill's logits differ";

  int64_t branch_rows = 0, joins = 0;
  for (const auto& r : tl.rows()) {
    branch_rows += r.queue == 1;
    joins += r.after[1] >= 0;
  }
  EXPECT_GT(branch_rows, 0) << "the attention's branch runs on the second stream";
  EXPECT_EQ(joins, 2) << "one join per layer (one step)";
  const TimelineOps::Summary s = tl.summarize(end);
  EXPECT_GT(s.device_busy, 0.0);
  EXPECT_LT(s.clock_uncertainty, 1e-3);
  std::printf("[cuda-timeline] %lld ops: wall %.3f ms, device busy %.3f, idle %.3f (before the first op %.3f, host "
              "behind %.3f = between ops %.3f + inside enqueues %.3f, after the last op %.3f), host enqueue %.3f ms\n",
              (long long)s.ops, s.wall * 1e3, s.device_busy * 1e3, s.device_idle * 1e3, s.before_first_op * 1e3,
              s.host_behind * 1e3, s.host_behind_between * 1e3, s.host_behind_enqueue * 1e3, s.after_last_op * 1e3,
              s.host_enqueue * 1e3);
  std::fflush(stdout);
}

TEST(CudaTimeline, BenchModelWritesTheTimeline) {
  DSV4_REQUIRE_GPU();
  const std::string file = ::testing::TempDir() + "dsv4-timeline.tsv";
  std::remove(file.c_str());
  const CliResult r = cli("bench model --config " + std::string(DSV4_SOURCE_DIR) +
                          "/tests/data/configs/deepseek-v4-flash-config.json --load-format dummy --layers 2 --device "
                          "cuda --ctx 0 --prefill 512 --steps 1 --no-profile --json --timeline " + file);
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json j = cli_json(r);
  ASSERT_TRUE(j.contains("timeline")) << r.out;
  const nlohmann::json& t = j.at("timeline");
  const int64_t ops = t.at("ops").get<int64_t>();
  EXPECT_GT(ops, 2 * 12) << "the ops of a prefill step of 2 layers (39 at c80989d: embed, ~18 per layer, head)";
  EXPECT_NEAR(t.at("device_busy_ms").get<double>() + t.at("device_idle_ms").get<double>(),
              t.at("wall_ms").get<double>(), 1e-6);
  EXPECT_FALSE(t.at("by_op").empty());
  std::ifstream f(file);
  ASSERT_TRUE(f) << file;
  std::string line;
  int64_t lines = 0;
  while (std::getline(f, line)) ++lines;
  EXPECT_EQ(lines, ops + 1) << "a header and one row per op";
  std::remove(file.c_str());
}

}  // namespace
}  // namespace dsv4::test::gpu
