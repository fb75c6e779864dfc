// StreamPump: a few threads that run the streamed responses' generations (server/streamed_choices.h) for as many
// streams as are open. A task does not wait on a thread of its own: it is run when something happened to it — its
// tokens arrived (RequestStream listener, loop thread), its client went away (the transport, reactor thread), the
// server stops (wake_all) — and returns until then. One task runs on one thread at a time; a notification that
// comes while it runs makes it run again afterwards. Tasks are held until their run() says they have ended.
// The rare step of a stream that has to block (taking its lease while the model loads or parks) runs on one more
// thread, in order (wait()), so that neither the pump threads nor the request threads block on it.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace dsv4 {

class StreamPump {
 public:
  class Task {
   public:
    virtual ~Task() = default;
    // Does what can be done now without blocking; true once the task has ended (it is then released).
    virtual bool run() = 0;

   private:
    friend class StreamPump;
    bool queued_ = false, running_ = false, again_ = false;  // StreamPump::mu_
  };

  explicit StreamPump(int threads);
  ~StreamPump();  // stops the threads; tasks still held are released without running again
  StreamPump(const StreamPump&) = delete;
  StreamPump& operator=(const StreamPump&) = delete;

  // Holds the task and runs it once.
  void start(std::shared_ptr<Task> t);
  // Runs the task (again) soon. Any thread; cheap; a task that has ended or is not held is ignored.
  void notify(Task* t);
  void wake_all();
  // Runs fn(false) on the waiting thread, one after the other in the order given; fn may block. What is still
  // waiting when the pump is destroyed runs then as fn(true) (it should only end its stream).
  void wait(std::function<void(bool stopping)> fn);
  size_t active() const;
  int threads() const { return int(threads_.size()); }

 private:
  void schedule_locked(Task* t);
  void thread_loop();
  void waiter_loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task*> ready_;
  std::unordered_map<Task*, std::shared_ptr<Task>> held_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
  std::deque<std::function<void(bool)>> waits_;  // mu_
  std::condition_variable wait_cv_;
  std::thread waiter_;  // started by the first wait()
};

}  // namespace dsv4
