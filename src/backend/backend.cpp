// Buffer, Workspace and the backend factory (backend.h).
#include "backend/backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "backend/cpu_backend.h"
#include "backend/ops.h"
#include "backend/step_graphs.h"
#include "backend/upload_queue.h"
#include "core/error.h"
#ifdef DSV4_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/decode_graph.h"
#include "backend/cuda/gemm_path.h"
#include "backend/cuda/kernels.h"
#endif

namespace dsv4 {

// ---- Buffer ------------------------------------------------------------------------------------------------------

Buffer::Buffer(Backend& be, size_t bytes, const char* what) : be_(&be), n_(bytes) {
  if (bytes > 0) p_ = be.alloc(bytes, what);
}

Buffer::~Buffer() { reset(); }

void Buffer::reset() noexcept {
  if (p_ && be_) be_->free(p_);
  p_ = nullptr;
  n_ = 0;
}

Buffer::Buffer(Buffer&& o) noexcept : be_(o.be_), p_(o.p_), n_(o.n_) {
  o.p_ = nullptr;
  o.n_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    be_ = o.be_;
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

Buffer::Buffer(const Buffer& o) : be_(o.be_) {
  if (o.p_) {
    p_ = be_->alloc(o.n_, "state copy");
    n_ = o.n_;
    be_->copy_on_device(p_, o.p_, n_);
  }
}

Buffer& Buffer::operator=(const Buffer& o) {
  if (this != &o) {
    if (o.p_ && be_ == o.be_ && n_ == o.n_ && p_) {
      be_->copy_on_device(p_, o.p_, n_);  // same size: reuse the allocation
    } else {
      Buffer tmp(o);
      *this = std::move(tmp);
    }
  }
  return *this;
}

// ---- Backend -----------------------------------------------------------------------------------------------------

void* Backend::alloc_pinned(size_t bytes, const char* what) {
  void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (!p) fail("out of host memory: {} needs {} bytes", what, bytes);
  return p;
}

void Backend::free_pinned(void* p) noexcept { std::free(p); }

double Backend::timeline_clock() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Backend::timeline_start(int n_markers, double* uncertainty) {
  synchronize();
  marks_.assign(size_t(std::max(n_markers, 0)), 0.0);
  if (uncertainty) *uncertainty = 0.0;
  return timeline_clock();
}

void Backend::timeline_mark(int i, int queue) {
  (void)queue;  // one queue: the ops run in order on the calling thread
  if (i < 0) fail("internal: timeline marker {}", i);
  if (size_t(i) >= marks_.size()) marks_.resize(size_t(i) + 1, 0.0);
  marks_[size_t(i)] = timeline_clock();
}

void Backend::timeline_read(int n, double* t) {
  if (n < 0 || size_t(n) > marks_.size()) fail("internal: {} timeline markers read, {} marked", n, marks_.size());
  std::copy(marks_.begin(), marks_.begin() + n, t);
}

Workspace& Backend::lane_workspace(int i) {
  if (i <= 0) return *ws_;
  while (lane_ws_list_.size() < size_t(i)) lane_ws_list_.push_back(std::make_unique<Workspace>(*this));
  return *lane_ws_list_[size_t(i - 1)];
}

std::unique_ptr<UploadQueue> Backend::make_upload_queue(int slots) {
  return std::make_unique<InOrderUploadQueue>(*this, slots);
}

// ---- Workspace ---------------------------------------------------------------------------------------------------

namespace {
constexpr size_t kAlign = 256;
constexpr size_t kMinChunk = size_t(64) << 20;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

void* Workspace::alloc_bytes(size_t bytes) {
  bytes = round_up(std::max<size_t>(bytes, 1));
  while (cur_ < chunks_.size() && off_ + bytes > chunks_[cur_].bytes()) {
    ++cur_;
    off_ = 0;
  }
  if (cur_ == chunks_.size()) {
    const size_t last = chunks_.empty() ? 0 : chunks_.back().bytes();
    chunks_.emplace_back(be_, std::max({bytes, kMinChunk, 2 * last}), "workspace");
    off_ = 0;
  }
  void* p = static_cast<char*>(chunks_[cur_].data()) + off_;
  off_ += bytes;
  high_ = std::max(high_, in_use());
  if (cur_ > far_.chunk || (cur_ == far_.chunk && off_ > far_.offset)) far_ = mark();
  return p;
}

size_t Workspace::in_use() const {
  size_t b = off_;
  for (size_t i = 0; i < cur_ && i < chunks_.size(); ++i) b += chunks_[i].bytes();
  return b;
}

size_t Workspace::capacity() const {
  size_t b = 0;
  for (const auto& c : chunks_) b += c.bytes();
  return b;
}

// ---- Backend -----------------------------------------------------------------------------------------------------

Backend::~Backend() = default;

void Ops::linear_grouped(const WeightView& W, const float* x, int64_t n_tok, int64_t groups, float* y,
                         const LinearOpts& o) const {
  if (groups <= 0 || W.rows % groups != 0 || o.row_begin != 0 || (o.row_end != -1 && o.row_end != W.rows))
    fail("internal: linear_grouped: {} rows in {} groups (row range {}..{})", W.rows, groups, o.row_begin, o.row_end);
  const int64_t R = W.rows / groups;
  LinearOpts og = o;
  for (int64_t g = 0; g < groups; ++g) {
    og.row_begin = g * R;
    og.row_end = (g + 1) * R;
    linear(W, x + g * n_tok * W.cols, n_tok, y + g * n_tok * R, og);
  }
}

void Ops::linear_pair(const WeightView& Wa, const WeightView& Wb, const float* x, int64_t n_tok, float* ya, float* yb,
                      const LinearOpts& o) const {
  if (Wa.cols != Wb.cols || o.row_begin != 0 || (o.row_end != -1 && (o.row_end != Wa.rows || o.row_end != Wb.rows)))
    fail("internal: linear_pair: [{}, {}] and [{}, {}] (row range {}..{})", Wa.rows, Wa.cols, Wb.rows, Wb.cols,
         o.row_begin, o.row_end);
  linear(Wa, x, n_tok, ya, o);
  linear(Wb, x, n_tok, yb, o);
}

void Ops::linear_check_finite(const WeightView& W, const float* x, int64_t n_tok, float* y, const LinearOpts& o,
                              int32_t* bad) const {
  linear(W, x, n_tok, y, o);
  const int64_t rows = (o.row_end < 0 ? W.rows : o.row_end) - o.row_begin;
  check_finite(y, n_tok, rows, bad);
}

void Ops::encode_rows(const float*, int64_t, const RowCodec& c, float*) const {
  fail("internal: this backend does not store compact state rows ({})", row_kind_name(c.kind));
}

Buffer Backend::upload_bytes(const void* src, size_t bytes, const char* what) {
  Buffer b(*this, bytes, what);
  if (bytes) copy_to_device(b.data(), src, bytes);
  return b;
}

bool cuda_compiled() {
#ifdef DSV4_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef DSV4_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

void set_cuda_deterministic(bool on) {
#ifdef DSV4_WITH_CUDA
  cuda::set_deterministic(on);
#else
  (void)on;
#endif
}

bool cuda_deterministic() {
#ifdef DSV4_WITH_CUDA
  return cuda::deterministic();
#else
  return false;
#endif
}

void set_cuda_pdl(bool on) {
#ifdef DSV4_WITH_CUDA
  cuda::set_pdl(on);
#else
  (void)on;
#endif
}

void set_cuda_wgmma(bool on) {
#ifdef DSV4_WITH_CUDA
  cuda::set_moe_big_kernel(on ? cuda::MoeBigKernel::auto_ : cuda::MoeBigKernel::mma);
#else
  (void)on;
#endif
}

bool cuda_pdl() {
#ifdef DSV4_WITH_CUDA
  return cuda::pdl();
#else
  return false;
#endif
}

bool cuda_pdl_active(const Backend& be) {
#ifdef DSV4_WITH_CUDA
  if (const auto* c = dynamic_cast<const cuda::CudaBackend*>(&be)) {
    c->activate();
    return cuda::pdl_active();
  }
#else
  (void)be;
#endif
  return false;
}

Device default_device() {
  if (cuda_compiled() && cuda_device_count() > 0) return Device{DeviceKind::cuda, 0};
  return Device{DeviceKind::cpu, 0};
}

std::unique_ptr<StepGraphs> make_step_graphs(Backend& be) {
#ifdef DSV4_WITH_CUDA
  if (auto* c = dynamic_cast<cuda::CudaBackend*>(&be)) return cuda::make_decode_graphs(*c);
#else
  (void)be;
#endif
  return nullptr;
}

std::unique_ptr<Backend> make_backend(const Device& device, const BackendOptions& opts) {
  if (device.is_cpu()) return std::make_unique<CpuBackend>(opts.n_threads);
#ifdef DSV4_WITH_CUDA
  return cuda::make_cuda_backend(device.index);
#else
  fail("--device {}: this dsv4 was built without CUDA support; rebuild with `scripts/setup.sh -DDSV4_CUDA=ON` (or "
       "scripts/build-cuda.sh) on a machine with the CUDA toolkit, or use --device cpu",
       device.name());
#endif
}

}  // namespace dsv4
