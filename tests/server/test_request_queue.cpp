#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "server/request_queue.h"

using namespace dsv4;
using namespace std::chrono_literals;

TEST(RequestQueue, AdmitsUpToMaxWaitingBehindTheRunningOne) {
  RequestQueue q(2);
  auto a = q.try_enter();
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->wait(nullptr));
  EXPECT_TRUE(q.busy());
  auto b = q.try_enter();
  auto c = q.try_enter();
  ASSERT_TRUE(b && c);
  EXPECT_EQ(q.waiting(), 2);
  EXPECT_FALSE(q.try_enter());  // full
  a.reset();                    // the running one finishes
  EXPECT_FALSE(q.busy());
  ASSERT_TRUE(b->wait(nullptr));
  EXPECT_TRUE(q.try_enter() != nullptr);  // one place freed
}

TEST(RequestQueue, RunsOneAtATimeInArrivalOrder) {
  RequestQueue q(16);
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> running{0}, max_running{0};
  std::vector<std::unique_ptr<RequestQueue::Ticket>> tickets;
  for (int i = 0; i < 8; ++i) tickets.push_back(q.try_enter());
  std::vector<std::thread> th;
  for (int i = 7; i >= 0; --i)  // threads start in reverse order: the tickets decide the order
    th.emplace_back([&, i] {
      ASSERT_TRUE(tickets[i]->wait(nullptr, 1ms));
      int now = ++running;
      max_running = std::max(max_running.load(), now);
      {
        std::lock_guard lk(mu);
        order.push_back(i);
      }
      std::this_thread::sleep_for(2ms);
      --running;
      tickets[i].reset();
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(max_running, 1);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(RequestQueue, AbandonedTicketsLeaveTheQueue) {
  RequestQueue q(1);
  auto a = q.try_enter();
  ASSERT_TRUE(a->wait(nullptr));
  auto b = q.try_enter();
  ASSERT_TRUE(b);
  EXPECT_FALSE(q.try_enter());
  std::atomic<bool> gone{false};
  std::thread t([&] { EXPECT_FALSE(b->wait([&] { return gone.load(); }, 1ms)); });
  std::this_thread::sleep_for(5ms);
  gone = true;
  t.join();
  EXPECT_EQ(q.waiting(), 0);
  EXPECT_TRUE(q.try_enter() != nullptr);
  EXPECT_THROW(RequestQueue(-1), std::exception);
}
