// StatePool buffers, slot resets, snapshot restores, page growth (state_pool.h).
#include "model/state_pool.h"

#include <algorithm>
#include <limits>

#include "backend/ops.h"
#include "core/error.h"

namespace dsv4 {

namespace {

constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();

Buffer rows_buffer(Backend& be, int64_t rows, int64_t width, const char* what) {
  return Buffer(be, size_t(rows) * size_t(width) * 4, what);
}

// Fill rows [r0, r0 + n) of a [*, width] fp32 buffer.
void fill_rows(Backend& be, Buffer& b, int64_t r0, int64_t n, int64_t width, float v) {
  if (b && n > 0) be.ops().fill(b.as<float>() + r0 * width, n * width, v);
}

void copy_rows(Backend& be, Buffer& dst, int64_t d0, const Buffer& src, int64_t s0, int64_t n, int64_t width) {
  if (n > 0 && dst && src)
    be.copy_on_device(dst.as<float>() + d0 * width, src.as<float>() + s0 * width, size_t(n * width) * 4);
}

}  // namespace

StatePool::StatePool(const ModelConfig& cfg, Backend& be, const StatePoolOptions& o)
    : layout_(StateLayout::of(cfg, o.drafter, o.rows)),
      be_(&be),
      n_slots_(o.n_slots),
      n_pages_(o.n_pages),
      n_snapshots_(o.n_snapshots) {
  if (n_slots_ < 1) fail("state pool: at least one slot is needed (got {})", n_slots_);
  if (n_pages_ < 0 || n_snapshots_ < 0) fail("state pool: negative page or snapshot count");
  const StateLayout& L = layout_;
  // int32 row ids: ring rows + the step's fresh rows, frontier rows + step rows, page rows
  if (n_slots_ * L.window + (int64_t(1) << 20) > kMaxRows || n_slots_ * 256 + (int64_t(1) << 20) > kMaxRows ||
      n_pages_ * StateLayout::kPageTokens > kMaxRows || n_snapshots_ * std::max<int64_t>(L.window, 4) > kMaxRows)
    fail("state pool: {} slots / {} pages / {} snapshots exceed the int32 row ids of the state layout", n_slots_,
         n_pages_, n_snapshots_);
  layers_.resize(L.layers.size());
  const int64_t KV = L.kv_row.words(), K = L.key_row.words();  // stored row widths (4-byte words)
  for (size_t l = 0; l < L.layers.size(); ++l) {
    const StateLayout::Layer& ly = L.layers[l];
    LayerBuffers& b = layers_[l];
    b.ring = rows_buffer(be, n_slots_ * L.window, KV, "window rings");
    b.snap_ring = rows_buffer(be, n_snapshots_ * L.window, KV, "snapshot rings");
    if (ly.ratio > 0) {
      const int64_t fr = ly.frontier_rows(), w = ly.coff * L.head_dim;
      b.cmp_k = rows_buffer(be, n_slots_ * fr, w, "compressor frontiers");
      b.cmp_s = rows_buffer(be, n_slots_ * fr, w, "compressor frontiers");
      b.comp = rows_buffer(be, n_pages_ * ly.rows_per_page, KV, "compressed KV pages");
      if (ly.coff == 2) {
        b.snap_cmp_k = rows_buffer(be, n_snapshots_ * ly.ratio, w, "snapshot frontiers");
        b.snap_cmp_s = rows_buffer(be, n_snapshots_ * ly.ratio, w, "snapshot frontiers");
      }
    }
    if (ly.indexer) {
      const int64_t fr = ly.frontier_rows(), w = ly.coff * L.index_head_dim;
      b.idx_k = rows_buffer(be, n_slots_ * fr, w, "indexer frontiers");
      b.idx_s = rows_buffer(be, n_slots_ * fr, w, "indexer frontiers");
      b.keys = rows_buffer(be, n_pages_ * ly.rows_per_page, K, "indexer key pages");
      b.snap_idx_k = rows_buffer(be, n_snapshots_ * ly.ratio, w, "snapshot frontiers");
      b.snap_idx_s = rows_buffer(be, n_snapshots_ * ly.ratio, w, "snapshot frontiers");
    }
    if (L.has_drafter()) {
      const int64_t R = L.spec_rows, sr = n_slots_ * (ly.changed_rows(R) + R);
      b.spec_ring = rows_buffer(be, n_slots_ * R, KV, "speculation rows");
      if (ly.ratio > 0) {
        b.spec_cmp_k = rows_buffer(be, sr, ly.coff * L.head_dim, "speculation rows");
        b.spec_cmp_s = rows_buffer(be, sr, ly.coff * L.head_dim, "speculation rows");
      }
      if (ly.indexer) {
        b.spec_idx_k = rows_buffer(be, sr, ly.coff * L.index_head_dim, "speculation rows");
        b.spec_idx_s = rows_buffer(be, sr, ly.coff * L.index_head_dim, "speculation rows");
      }
    }
  }
  if (L.has_mtp()) {
    hidden_ = rows_buffer(be, n_slots_ * L.spec_rows, L.hidden_width, "speculation hidden rows");
    be.ops().fill(hidden_.as<float>(), n_slots_ * L.spec_rows * L.hidden_width, 0.0f);
  }
  for (int64_t s = 0; s < n_slots_; ++s) reset_slot(s);
}

size_t StatePool::bytes() const {
  size_t n = 0;
  for (const LayerBuffers& b : layers_)
    for (const Buffer* x : {&b.ring, &b.cmp_k, &b.cmp_s, &b.idx_k, &b.idx_s, &b.comp, &b.keys, &b.snap_ring,
                            &b.snap_cmp_k, &b.snap_cmp_s, &b.snap_idx_k, &b.snap_idx_s, &b.spec_ring, &b.spec_cmp_k,
                            &b.spec_cmp_s, &b.spec_idx_k, &b.spec_idx_s})
      n += x->bytes();
  return n + hidden_.bytes();
}

void StatePool::check_slot(int64_t slot) const {
  if (slot < 0 || slot >= n_slots_) fail("internal: state slot {} outside [0, {})", slot, n_slots_);
}

void StatePool::reset_slot(int64_t slot) {
  check_slot(slot);
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const StateLayout::Layer& ly = layout_.layers[l];
    LayerBuffers& b = layers_[l];
    fill_rows(*be_, b.ring, slot * layout_.window, layout_.window, layout_.kv_row.words(), 0.0f);  // zero bits: 0
    if (ly.ratio > 0) {
      const int64_t fr = ly.frontier_rows(), w = ly.coff * layout_.head_dim;
      fill_rows(*be_, b.cmp_k, slot * fr, fr, w, 0.0f);
      fill_rows(*be_, b.cmp_s, slot * fr, fr, w, -inf);
    }
    if (ly.indexer) {
      const int64_t fr = ly.frontier_rows(), w = ly.coff * layout_.index_head_dim;
      fill_rows(*be_, b.idx_k, slot * fr, fr, w, 0.0f);
      fill_rows(*be_, b.idx_s, slot * fr, fr, w, -inf);
    }
  }
}

void StatePool::restore_snapshot(int64_t snap, int64_t slot) {
  if (snap < 0 || snap >= n_snapshots_) fail("internal: snapshot {} outside [0, {})", snap, n_snapshots_);
  reset_slot(slot);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const StateLayout::Layer& ly = layout_.layers[l];
    LayerBuffers& b = layers_[l];
    copy_rows(*be_, b.ring, slot * layout_.window, b.snap_ring, snap * layout_.window, layout_.window,
              layout_.kv_row.words());
    if (ly.coff == 2) {
      const int64_t fr = ly.frontier_rows(), m = ly.ratio;
      copy_rows(*be_, b.cmp_k, slot * fr, b.snap_cmp_k, snap * m, m, ly.coff * layout_.head_dim);
      copy_rows(*be_, b.cmp_s, slot * fr, b.snap_cmp_s, snap * m, m, ly.coff * layout_.head_dim);
      copy_rows(*be_, b.idx_k, slot * fr, b.snap_idx_k, snap * m, m, ly.coff * layout_.index_head_dim);
      copy_rows(*be_, b.idx_s, slot * fr, b.snap_idx_s, snap * m, m, ly.coff * layout_.index_head_dim);
    }
  }
}

void StatePool::copy_slot(int64_t from, int64_t to) {
  check_slot(from);
  check_slot(to);
  if (from == to) return;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const StateLayout::Layer& ly = layout_.layers[l];
    LayerBuffers& b = layers_[l];
    copy_rows(*be_, b.ring, to * layout_.window, b.ring, from * layout_.window, layout_.window,
              layout_.kv_row.words());
    const int64_t fr = ly.frontier_rows();
    copy_rows(*be_, b.cmp_k, to * fr, b.cmp_k, from * fr, fr, ly.coff * layout_.head_dim);
    copy_rows(*be_, b.cmp_s, to * fr, b.cmp_s, from * fr, fr, ly.coff * layout_.head_dim);
    copy_rows(*be_, b.idx_k, to * fr, b.idx_k, from * fr, fr, ly.coff * layout_.index_head_dim);
    copy_rows(*be_, b.idx_s, to * fr, b.idx_s, from * fr, fr, ly.coff * layout_.index_head_dim);
  }
  const int64_t R = layout_.spec_rows;
  copy_rows(*be_, hidden_, to * R, hidden_, from * R, R, layout_.hidden_width);
}

void StatePool::grow_pages(int64_t n) {
  if (n <= n_pages_) return;
  if (n * StateLayout::kPageTokens > kMaxRows) fail("state pool: {} pages exceed the int32 row ids", n);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const StateLayout::Layer& ly = layout_.layers[l];
    LayerBuffers& b = layers_[l];
    auto grow = [&](Buffer& buf, int64_t width, const char* what) {
      Buffer nb = rows_buffer(*be_, n * ly.rows_per_page, width, what);
      copy_rows(*be_, nb, 0, buf, 0, n_pages_ * ly.rows_per_page, width);
      buf = std::move(nb);
    };
    if (ly.ratio > 0) grow(b.comp, layout_.kv_row.words(), "compressed KV pages");
    if (ly.indexer) grow(b.keys, layout_.key_row.words(), "indexer key pages");
  }
  n_pages_ = n;
}

size_t StatePool::SlotCopy::bytes() const {
  size_t n = 0;
  for (const Buffer& b : buffers) n += b.bytes();
  return n;
}

StatePool::SlotCopy StatePool::save_slot(int64_t slot) const {
  check_slot(slot);
  SlotCopy c;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const StateLayout::Layer& ly = layout_.layers[l];
    const LayerBuffers& b = layers_[l];
    const int64_t fr = ly.frontier_rows();
    auto save = [&](const Buffer& src, int64_t r0, int64_t n, int64_t width) {
      Buffer d = src ? rows_buffer(*be_, n, width, "state checkpoint") : Buffer();
      copy_rows(*be_, d, 0, src, r0, n, width);
      c.buffers.push_back(std::move(d));
    };
    save(b.ring, slot * layout_.window, layout_.window, layout_.kv_row.words());
    save(b.cmp_k, slot * fr, fr, ly.coff * layout_.head_dim);
    save(b.cmp_s, slot * fr, fr, ly.coff * layout_.head_dim);
    save(b.idx_k, slot * fr, fr, ly.coff * layout_.index_head_dim);
    save(b.idx_s, slot * fr, fr, ly.coff * layout_.index_head_dim);
  }
  return c;
}

void StatePool::load_slot(const SlotCopy& c, int64_t slot) {
  check_slot(slot);
  if (c.buffers.size() != 5 * layers_.size()) fail("internal: slot copy does not match the state pool");
  for (size_t l = 0; l < layers_.size(); ++l) {
    const StateLayout::Layer& ly = layout_.layers[l];
    LayerBuffers& b = layers_[l];
    const int64_t fr = ly.frontier_rows();
    const Buffer* s = &c.buffers[5 * l];
    copy_rows(*be_, b.ring, slot * layout_.window, s[0], 0, layout_.window, layout_.kv_row.words());
    copy_rows(*be_, b.cmp_k, slot * fr, s[1], 0, fr, ly.coff * layout_.head_dim);
    copy_rows(*be_, b.cmp_s, slot * fr, s[2], 0, fr, ly.coff * layout_.head_dim);
    copy_rows(*be_, b.idx_k, slot * fr, s[3], 0, fr, ly.coff * layout_.index_head_dim);
    copy_rows(*be_, b.idx_s, slot * fr, s[4], 0, fr, ly.coff * layout_.index_head_dim);
  }
}

}  // namespace dsv4
