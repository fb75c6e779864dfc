// A compute backend: one device (the host CPU or one CUDA GPU), its memory, its op implementations (ops.h) and a
// per-step workspace. The forward pass (src/model/) is written once against this interface.
//
// Memory model: every pointer an op receives lives on the backend's device. Work is queued in order on the backend
// (the CUDA backend: one stream); copies to the host and synchronize() wait for everything queued before them.
// Weights are made resident once at load (upload()); sequence state lives in Buffers on the device of the layer it
// belongs to; per-step scratch comes from the Workspace (a bump arena with marks, no allocation once warm).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/weight_view.h"
#include "core/device.h"

namespace dsv4 {

class Ops;
class Backend;
class UploadQueue;

// Owning device allocation (movable; copying clones the contents on the device).
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& be, size_t bytes, const char* what);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer& o);
  Buffer& operator=(const Buffer& o);

  void* data() { return p_; }
  const void* data() const { return p_; }
  template <class T> T* as() { return static_cast<T*>(p_); }
  template <class T> const T* as() const { return static_cast<const T*>(p_); }
  size_t bytes() const { return n_; }
  Backend* backend() const { return be_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  void reset() noexcept;
  Backend* be_ = nullptr;
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Bump allocator over device memory for the scratch of one forward step. Allocations are 256-byte aligned; a
// Scope releases everything allocated inside it (stack discipline). Chunks are kept for reuse (no device
// allocation once warm); a request larger than what is left opens a new chunk. Stream ordering makes reuse of
// released memory by later queued work safe.
class Workspace {
 public:
  explicit Workspace(Backend& be) : be_(be) {}
  template <class T> T* alloc(int64_t n) { return static_cast<T*>(alloc_bytes(size_t(n) * sizeof(T))); }
  void* alloc_bytes(size_t bytes);
  struct Mark {
    size_t chunk = 0, offset = 0;
  };
  Mark mark() const { return {cur_, off_}; }
  void release(Mark m) { cur_ = m.chunk, off_ = m.offset; }
  // The furthest point allocated to since reset_furthest(), and a jump past it: work queued on another stream that
  // used (and released) memory up to there may still be running, so the caller's later allocations must start
  // beyond it (Ops::branch_end). The enclosing Scope releases the skipped memory as usual.
  void reset_furthest() { far_ = mark(); }
  Mark furthest() const { return far_; }
  void advance_to(Mark m) {
    if (m.chunk > cur_ || (m.chunk == cur_ && m.offset > off_)) release(m);
  }
  // Bytes of device memory held / the most in use at once.
  size_t capacity() const;
  size_t high_water() const { return high_; }

  class Scope {
   public:
    explicit Scope(Workspace& ws) : ws_(ws), m_(ws.mark()) {}
    ~Scope() { ws_.release(m_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Workspace& ws_;
    Mark m_;
  };

 private:
  size_t in_use() const;
  Backend& be_;
  std::vector<Buffer> chunks_;
  size_t cur_ = 0, off_ = 0, high_ = 0;
  Mark far_;
};

struct MemoryInfo {
  size_t free = 0, total = 0;  // bytes (CPU: MemAvailable / MemTotal)
};

class Backend {
 public:
  virtual ~Backend();
  virtual Device device() const = 0;
  // One line for logs, e.g. "cpu (16 threads, avx512)" or "cuda:0 NVIDIA H200, 139.8 GiB, sm_90".
  virtual std::string description() const = 0;
  virtual const Ops& ops() const = 0;
  virtual MemoryInfo memory() const = 0;
  // The device's dense FP8 tensor-core peak in flop/s (benchmarks' denominator), 0 when not known or not applicable.
  virtual double fp8_peak_flops() const { return 0.0; }
  // Whether this backend's ops read the compact state row formats (format/row_format.h, model/state_layout.h) in
  // reference numerics: then the model's state pools store rows compactly. Default: fp32 rows.
  virtual bool compact_state_rows() const { return false; }

  // Device memory. alloc throws dsv4::Error naming `what`, the bytes asked for and the bytes free.
  virtual void* alloc(size_t bytes, const char* what) = 0;
  virtual void free(void* p) noexcept = 0;
  // Copies, queued in order with the ops. to_host waits for the copy (and everything queued before it).
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
  // Wait for all queued work; throws dsv4::Error if the device reported a failure.
  virtual void synchronize() = 0;

  // Host staging memory for copies that overlap device work (model/split_moe.h). CUDA: page-locked host memory;
  // default: ordinary host memory. Throws dsv4::Error naming `what` when it cannot be had.
  virtual void* alloc_pinned(size_t bytes, const char* what);
  virtual void free_pinned(void* p) noexcept;
  // A device -> host copy queued in order with the ops that does not wait for it; wait_copies_to_host() waits
  // until every such copy queued before it has landed (not for the work queued after them). Default: a plain
  // copy_to_host (waits at once).
  virtual void copy_to_host_async(void* dst, const void* src, size_t bytes) { copy_to_host(dst, src, bytes); }
  virtual void wait_copies_to_host() {}
  // Host memory streamed to the device beside the ops (backend/upload_queue.h; model/expert_staging.h): a queue of
  // host -> device copies into `slots` staging regions. Default: InOrderUploadQueue (copies queued with the ops).
  virtual std::unique_ptr<UploadQueue> make_upload_queue(int slots);
  // Page-lock host memory [p, p + bytes) so that copies from it run at the bus's full speed (CUDA: cudaHostRegister).
  // Returns false where there is nothing to gain (default, the CPU) or it cannot be done (`why` then says why);
  // copies from memory that is not pinned still work, slower. A pinned range is released with unpin_host(p) before
  // its memory is freed or unmapped.
  virtual bool pin_host(const void* p, size_t bytes, std::string* why) {
    (void)p, (void)bytes;
    if (why) *why = "not needed on this backend";
    return false;
  }
  virtual void unpin_host(const void* p) noexcept { (void)p; }

  // Timeline markers (benchmarks: backend/timeline_ops.h): when the device got through the work queued before a
  // marker, read afterwards, without a wait per op. The default is for backends whose ops have finished when they
  // return (the CPU): a marker takes the host clock. CUDA records a timing event on the marker's stream (one event
  // per marker index, created once and reused); recording inside a CUDA graph capture throws.
  //   timeline_start(n): waits for the queued work, makes room for markers 0..n-1 (more may be marked: each one past
  //     those is made when first marked) and sets the origin; returns the origin as host steady_clock seconds.
  //     *uncertainty (optional): how far the origin's device time may be off that host time (seconds).
  //   timeline_mark(i, queue): marker i after the work queued so far on `queue`: 0 the ops' main queue, 1 the queue
  //     of the ops between Ops::branch_begin() and branch_end().
  //   timeline_read(n, t): waits for markers 0..n-1; t[i] = the host steady_clock seconds at which the device reached
  //     marker i (the origin plus the device's time since the origin).
  virtual double timeline_start(int n_markers, double* uncertainty = nullptr);
  // The timeline's host clock: steady_clock seconds (every host time above and in TimelineOps).
  static double timeline_clock();
  virtual void timeline_mark(int i, int queue);
  virtual void timeline_read(int n, double* t);

  // Make a checkpoint weight resident on this device (CPU: a view of the mapped bytes, no copy). The device memory
  // is appended to `storage` (the caller keeps it as long as the view is used).
  virtual WeightView upload(const WeightView& host, std::vector<Buffer>& storage) = 0;
  // The same, with the storage kept by the backend until it is destroyed (tests, tools).
  WeightView upload(const WeightView& host) { return upload(host, kept_); }
  // A weight already in this backend's memory (dummy weights generated there): only the backend-private data that
  // upload() would add (WeightView::aux, e.g. CUDA's fp32 scale grid for cuBLASLt), kept in `storage`.
  virtual WeightView adopt(const WeightView& resident, std::vector<Buffer>& storage) {
    (void)storage;
    return resident;
  }
  // The LM head, already resident (upload() or adopt()): the one matrix that every decode step multiplies for every
  // sequence. A backend may add a layout of its own for decode-sized products, kept in `storage`. CPU: a BF16 head
  // gets a panel copy (WeightView::panels, the head's bytes once more in host memory) that the batched decode GEMVs
  // read without transposing rows. Default: the view unchanged.
  virtual WeightView add_head_layout(const WeightView& resident, std::vector<Buffer>& storage) {
    (void)storage;
    return resident;
  }
  // Bytes of device memory upload() takes for `host` (0 when the backend reads the mapped checkpoint).
  virtual size_t resident_bytes(const WeightView& host) const { return 0; }

  // Fill `bytes` bytes at p (device memory) with deterministic pseudo-random data of a checkpoint format (dummy
  // weights for benchmarks): e4m3 codes of magnitude in [1/8, 2), packed FP4 pairs (every nibble), E8M0 scale bytes
  // 127 + param (+-1 jitter), or bf16 values uniform in [-param, param].
  enum class RandomFill { e4m3, fp4_pairs, e8m0, bf16 };
  virtual void fill_random(void* p, size_t bytes, RandomFill kind, float param, uint64_t seed) = 0;

  // The calling thread's workspace: the backend's own or, while a LaneScope of this backend is alive on the thread,
  // that lane's (CPU: the lanes of a batched step run beside each other, each on its own thread, model/forward.cpp).
  Workspace& workspace() { return lane_be_ == this ? *lane_ws_ : *ws_; }
  // Lane i's workspace: 0 is the backend's own, i >= 1 one more, made on first use (call before the lanes start).
  Workspace& lane_workspace(int i);
  // Makes `ws` (a lane_workspace of `be`) the calling thread's workspace() of `be` while alive.
  class LaneScope {
   public:
    LaneScope(Backend& be, Workspace& ws) : be_(lane_be_), ws_(lane_ws_) {
      lane_be_ = &be;
      lane_ws_ = &ws;
    }
    ~LaneScope() {
      lane_be_ = be_;
      lane_ws_ = ws_;
    }
    LaneScope(const LaneScope&) = delete;
    LaneScope& operator=(const LaneScope&) = delete;

   private:
    Backend* be_;  // what the thread had before
    Workspace* ws_;
  };

  // Helpers over copy_to_device.
  Buffer upload_bytes(const void* src, size_t bytes, const char* what);
  template <class T> Buffer upload_vector(const std::vector<T>& v, const char* what) {
    return upload_bytes(v.data(), v.size() * sizeof(T), what);
  }

 protected:
  Backend() : ws_(std::make_unique<Workspace>(*this)) {}
  // Derived destructors call this first: the workspace's chunks are freed through the (still complete) backend.
  void release_workspace() {
    kept_.clear();
    lane_ws_list_.clear();
    ws_.reset();
  }

 private:
  std::unique_ptr<Workspace> ws_;
  std::vector<std::unique_ptr<Workspace>> lane_ws_list_;  // lanes 1, 2, ...
  static inline thread_local Backend* lane_be_ = nullptr;  // LaneScope: the backend and workspace of this thread
  static inline thread_local Workspace* lane_ws_ = nullptr;
  std::vector<Buffer> kept_;
  std::vector<double> marks_;  // timeline markers of the default (host clock) implementation
};

struct BackendOptions {
  int n_threads = 0;  // CPU: OpenMP threads (<= 0: all cores)
};

// The backend of `device`. Throws dsv4::Error (one line, with what to do) when the device does not exist, the build
// has no CUDA support, or the CUDA driver is missing.
std::unique_ptr<Backend> make_backend(const Device& device, const BackendOptions& opts = {});
// The CUDA backend's deterministic mode, process-wide (the CLI's --deterministic; default off): every GEMM on the
// kernels that repeat the CPU's summation order, so CUDA results equal the CPU backend's bitwise (slower: no
// cuBLASLt, no fast decode kernels). Off: the fast kernels, deterministic too but with their own fp32 rounding
// (greedy-identical to the CPU except at near-ties; tests/gpu states the tolerances). No effect on the CPU backend
// or in a build without CUDA.
void set_cuda_deterministic(bool on);
bool cuda_deterministic();
// Programmatic Dependent Launch of the CUDA backend's decode-path kernels, process-wide (default on; the CLI's
// --no-pdl turns it off): on an sm_90+ GPU each such kernel may be scheduled while the one before it still runs and
// loads its weights before it waits for that kernel's results. Scheduling only: results are bitwise the same.
// Later launches follow the switch (recorded step graphs are keyed by it). No effect on the CPU backend, on GPUs
// before sm_90 or in a build without CUDA. cuda_pdl_active: whether `be` launches that way now.
void set_cuda_pdl(bool on);
bool cuda_pdl();
// The prefill expert kernel of the CUDA backend's fast mode, process-wide (default off until the wgmma kernel has
// passed its GPU tests; `bench model --wgmma` turns it on): on a compute capability 9.0 GPU with the sm_90a build,
// wgmma (k_moe_wgmma.cu); off, or elsewhere, the mma.sync kernel (k_moe_tc.cu). Both within the fast mode's tolerance, not bitwise equal to each other. Later
// launches follow the switch. No effect on the CPU backend or in a build without CUDA.
void set_cuda_wgmma(bool on);
bool cuda_pdl_active(const Backend& be);
// Whether this build includes the CUDA backend, and how many CUDA devices are usable (0 without a driver or GPU).
bool cuda_compiled();
int cuda_device_count();
// The device used when none is named: cuda:0 when the build has CUDA and a GPU is present, else cpu.
Device default_device();

}  // namespace dsv4
