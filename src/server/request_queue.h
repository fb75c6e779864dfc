// Bounded FIFO admission for a single generation engine: one request runs at a time, at most `max_waiting` wait
// behind it (in arrival order); more are refused (the server answers 503 + Retry-After).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

namespace dsv4 {

class RequestQueue {
 public:
  explicit RequestQueue(int max_waiting);

  // A place in the queue; destroying it leaves the queue (or frees the engine if it was running).
  class Ticket {
   public:
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    // Blocks until this ticket is first in line and the engine is free, then marks it running and returns true.
    // `abandon` is polled every `poll`; when it returns true the ticket leaves the queue and wait() returns false.
    bool wait(const std::function<bool()>& abandon, std::chrono::milliseconds poll = std::chrono::milliseconds(50));
    bool running() const { return running_; }

   private:
    friend class RequestQueue;
    Ticket(RequestQueue& q, uint64_t id) : q_(q), id_(id) {}
    RequestQueue& q_;
    uint64_t id_;
    bool running_ = false;
    bool left_ = false;
  };

  // nullptr when max_waiting requests are already waiting.
  std::unique_ptr<Ticket> try_enter();
  // Always gets a place, beyond max_waiting (administrative operations: park / unpark).
  std::unique_ptr<Ticket> enter();

  int waiting() const;
  bool busy() const;
  int max_waiting() const { return max_waiting_; }

 private:
  int max_waiting_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint64_t> waiting_;
  bool busy_ = false;
  uint64_t next_id_ = 0;
};

}  // namespace dsv4
