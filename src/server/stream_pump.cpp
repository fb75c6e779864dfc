// The threads that advance streamed generations (stream_pump.h).
#include "server/stream_pump.h"

#include <algorithm>

namespace dsv4 {

StreamPump::StreamPump(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { thread_loop(); });
}

StreamPump::~StreamPump() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  wait_cv_.notify_all();
  if (waiter_.joinable()) waiter_.join();  // it runs what still waits as fn(true)
  for (auto& t : threads_) t.join();
  std::unordered_map<Task*, std::shared_ptr<Task>> held;
  {
    std::lock_guard lk(mu_);
    held.swap(held_);
    ready_.clear();
  }
  held.clear();  // outside the lock: a task's destructor may notify
}

void StreamPump::wait(std::function<void(bool)> fn) {
  bool now = false;
  {
    std::lock_guard lk(mu_);
    if (!stop_) {
      waits_.push_back(std::move(fn));
      if (!waiter_.joinable()) waiter_ = std::thread([this] { waiter_loop(); });
    } else {
      now = true;
    }
  }
  if (now) {
    fn(true);
    return;
  }
  wait_cv_.notify_one();
}

void StreamPump::waiter_loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    wait_cv_.wait(lk, [&] { return stop_ || !waits_.empty(); });
    if (waits_.empty()) return;  // stopping, nothing left
    std::function<void(bool)> fn = std::move(waits_.front());
    waits_.pop_front();
    const bool stopping = stop_;
    lk.unlock();
    try {
      fn(stopping);
    } catch (...) {
    }
    fn = nullptr;  // what it holds goes outside the lock
    lk.lock();
  }
}

void StreamPump::start(std::shared_ptr<Task> t) {
  std::lock_guard lk(mu_);
  Task* p = t.get();
  held_.emplace(p, std::move(t));
  schedule_locked(p);
}

void StreamPump::schedule_locked(Task* t) {
  if (t->running_) {
    t->again_ = true;
    return;
  }
  if (t->queued_) return;
  t->queued_ = true;
  ready_.push_back(t);
  cv_.notify_one();
}

void StreamPump::notify(Task* t) {
  std::lock_guard lk(mu_);
  if (stop_ || held_.find(t) == held_.end()) return;
  schedule_locked(t);
}

void StreamPump::wake_all() {
  std::lock_guard lk(mu_);
  for (auto& [p, t] : held_) schedule_locked(p);
}

size_t StreamPump::active() const {
  std::lock_guard lk(mu_);
  return held_.size();
}

void StreamPump::thread_loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !ready_.empty(); });
    if (stop_) return;
    Task* t = ready_.front();
    ready_.pop_front();
    t->queued_ = false;
    t->running_ = true;
    t->again_ = false;
    std::shared_ptr<Task> keep = held_.at(t);
    lk.unlock();
    bool ended = true;
    try {
      ended = t->run();
    } catch (...) {
      ended = true;  // a task must not take a pump thread down with it
    }
    lk.lock();
    t->running_ = false;
    if (ended) {
      held_.erase(t);
      lk.unlock();
      keep.reset();  // the task's destructor runs outside the lock
      lk.lock();
      continue;
    }
    if (t->again_) schedule_locked(t);
  }
}

}  // namespace dsv4
