#include "server/sse_writer.h"

#include <algorithm>

namespace dsv4 {

namespace {
std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}
}  // namespace

bool SseWriter::send_raw(const std::string& s) {
  std::lock_guard lk(mu_);
  if (!ok_) return false;
  ok_ = sink_.write(s.data(), s.size());
  last_ = std::chrono::steady_clock::now();
  return ok_;
}

bool SseWriter::data(const nlohmann::ordered_json& j) { return send_raw("data: " + dump(j) + "\n\n"); }

bool SseWriter::event(const std::string& type, const nlohmann::ordered_json& j) {
  return send_raw("event: " + type + "\ndata: " + dump(j) + "\n\n");
}

bool SseWriter::ok() {
  std::lock_guard lk(mu_);
  return ok_;
}

void SseWriter::keepalive_if_idle(std::chrono::duration<double> interval) {
  std::lock_guard lk(mu_);
  if (!ok_ || std::chrono::steady_clock::now() - last_ < interval) return;
  static const std::string ka = ": keepalive\n\n";
  ok_ = sink_.write(ka.data(), ka.size());
  last_ = std::chrono::steady_clock::now();
}

Keepalive::Keepalive(SseWriter& w, double interval_s) : w_(w), interval_(interval_s) {
  th_ = std::thread([this] {
    std::unique_lock lk(mu_);
    auto step = std::chrono::duration<double>(std::max(0.01, interval_.count() / 4));
    while (!stop_) {
      cv_.wait_for(lk, step);
      if (stop_) break;
      lk.unlock();
      w_.keepalive_if_idle(interval_);
      lk.lock();
    }
  });
}

Keepalive::~Keepalive() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  th_.join();
}

}  // namespace dsv4
