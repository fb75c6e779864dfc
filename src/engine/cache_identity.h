// The identity that stored sequence state is bound to (the prefix cache's block-hash salt, engine/block_hash.h, and
// the header of every disk-tier file, engine/disk_cache.h): state rows are only reusable by the same weights, the
// same numerics, the same state layout and a backend that computes the same rows.
//
// Hashed (XXH64, chained): the bytes of config.json, a fingerprint of the checkpoint's safetensors files (name,
// size, the first 64 KiB — the header — and 4 KiB at the middle and at the end of each: cheap, and different for
// any retrained or fine-tuned checkpoint of the same shape), the numerics, the StateLayout (version, row format,
// window, head widths, per-layer ratio / overlap / rows per page), and the device kind (cpu / cuda: the CUDA
// prefill GEMMs are not bitwise equal to the CPU's), and the disk tier's format version. A model without files
// (load_dummy) hashes its config fields.
#pragma once
#include <cstdint>

#include "model/model.h"

namespace dsv4 {

uint64_t cache_identity(const Model& model);

}  // namespace dsv4
