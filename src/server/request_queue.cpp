#include "server/request_queue.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

RequestQueue::RequestQueue(int max_waiting) : max_waiting_(max_waiting) {
  if (max_waiting < 0) fail("queue size must be >= 0, got {}", max_waiting);
}

std::unique_ptr<RequestQueue::Ticket> RequestQueue::try_enter() {
  std::lock_guard lk(mu_);
  if (static_cast<int>(waiting_.size()) >= max_waiting_ && (busy_ || !waiting_.empty())) return nullptr;
  uint64_t id = next_id_++;
  waiting_.push_back(id);
  return std::unique_ptr<Ticket>(new Ticket(*this, id));
}

std::unique_ptr<RequestQueue::Ticket> RequestQueue::enter() {
  std::lock_guard lk(mu_);
  uint64_t id = next_id_++;
  waiting_.push_back(id);
  return std::unique_ptr<Ticket>(new Ticket(*this, id));
}

bool RequestQueue::Ticket::wait(const std::function<bool()>& abandon, std::chrono::milliseconds poll) {
  std::unique_lock lk(q_.mu_);
  for (;;) {
    if (running_) return true;
    if (!q_.busy_ && !q_.waiting_.empty() && q_.waiting_.front() == id_) {
      q_.waiting_.pop_front();
      q_.busy_ = running_ = true;
      return true;
    }
    q_.cv_.wait_for(lk, poll);
    lk.unlock();
    bool gone = abandon && abandon();
    lk.lock();
    if (gone && !running_) {
      auto it = std::find(q_.waiting_.begin(), q_.waiting_.end(), id_);
      if (it != q_.waiting_.end()) q_.waiting_.erase(it);
      left_ = true;
      q_.cv_.notify_all();
      return false;
    }
  }
}

RequestQueue::Ticket::~Ticket() {
  std::lock_guard lk(q_.mu_);
  if (running_) {
    q_.busy_ = false;
  } else if (!left_) {
    auto it = std::find(q_.waiting_.begin(), q_.waiting_.end(), id_);
    if (it != q_.waiting_.end()) q_.waiting_.erase(it);
  }
  q_.cv_.notify_all();
}

int RequestQueue::waiting() const {
  std::lock_guard lk(mu_);
  return static_cast<int>(waiting_.size());
}

bool RequestQueue::busy() const {
  std::lock_guard lk(mu_);
  return busy_;
}

}  // namespace dsv4
