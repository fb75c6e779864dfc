// Loading a checkpoint folder for generation: the model (dsv4::Model behind the LanguageModel interface) and its
// tokenizer.json (optional: tiny test models have none). Used by `dsv4 generate`, `chat` and `serve`.
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "core/device.h"
#include "model/expert_placement.h"
#include "model/language_model.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

struct LoadedModel {
  std::shared_ptr<const LanguageModel> model;
  std::shared_ptr<const Tokenizer> tokenizer;  // null when the folder has no tokenizer.json
  std::string name;                            // the folder name (e.g. "DeepSeek-V4-Flash")
  std::string device;                          // the backend's description (e.g. "cuda:0 NVIDIA H200, ...")
};

// numerics: "reference" | "dense"; threads: CPU compute threads (<= 0: all cores); device: where the model runs;
// spec_draft: draft tokens per step of speculative decoding with the checkpoint's drafter, the MTP module or the
// DSpark drafter (0: off; > 0 loads the drafter, and the engines built on the model speculate); placement: routed experts on the device or the CPU
// (model/expert_placement.h).
// Throws dsv4::Error for a missing folder, bad numerics name, an unusable device, a model that does not fit, or any
// load failure (message names the file).
LoadedModel load_model(const std::filesystem::path& dir, const std::string& numerics, int threads,
                       const Device& device = Device{}, int spec_draft = 0,
                       const PlacementOptions& placement = {});

// Folder name of `dir`, ignoring trailing slashes ("models/foo/" -> "foo").
std::string model_folder_name(const std::filesystem::path& dir);

}  // namespace dsv4
