#include "engine/model_loader.h"

#include "backend/numerics.h"
#include "backend/parallel.h"
#include "core/error.h"
#include "core/log.h"
#include "model/model.h"

namespace dsv4 {

std::string model_folder_name(const std::filesystem::path& dir) {
  std::filesystem::path p = dir.lexically_normal();
  std::string name = p.filename().string();
  if (name.empty()) name = p.parent_path().filename().string();
  if (name.empty() || name == ".") name = std::filesystem::absolute(p).lexically_normal().filename().string();
  return name.empty() ? std::string("dsv4") : name;
}

LoadedModel load_model(const std::filesystem::path& dir, const std::string& numerics, int threads,
                       const Device& device, int spec_draft, const PlacementOptions& placement) {
  auto num = parse_numerics(numerics);
  if (!num) fail("--numerics must be 'reference' or 'dense', got '{}'", numerics);
  if (!std::filesystem::is_directory(dir)) fail("{}: not a model folder (no such directory)", dir.string());
  set_num_threads(threads);
  LoadedModel out;
  ModelOptions mo;
  mo.numerics = *num;
  mo.device = device;
  mo.spec_draft = spec_draft;
  mo.placement = placement;
  // tokens per forward step: a GPU reads every weight once per step, so prefill wants big steps (serve's default
  // --batch-tokens on CUDA is 2048 too); the CPU keeps small ones (bounded scratch, no gain from bigger)
  mo.ubatch = device.is_cpu() ? 256 : 2048;
  auto model = Model::load(dir, mo);
  out.device = model->backend().description();
  if (placement.any()) out.device += "; " + model->placement().summary();
  if (const SplitMoe* sm = model->split_moe(); sm && sm->stage_min_tokens() > 0)
    out.device += fmt::format("; calls of >= {} tokens run them on the device (staged)", sm->stage_min_tokens());
  out.model = std::move(model);
  const auto tj = dir / "tokenizer.json";
  if (std::filesystem::exists(tj)) {
    out.tokenizer = std::make_shared<Tokenizer>(Tokenizer::from_file(tj));
    if (out.tokenizer->n_vocab() > out.model->n_vocab())
      fail("{}: {} tokens, more than the model's vocab_size {}", tj.string(), out.tokenizer->n_vocab(),
           out.model->n_vocab());
  }
  out.name = model_folder_name(dir);
  log::info("loaded {} ({} numerics, vocab {}, max context {}){}", out.name, numerics, out.model->n_vocab(),
            out.model->max_context(), out.tokenizer ? "" : ", no tokenizer.json");
  return out;
}

}  // namespace dsv4
