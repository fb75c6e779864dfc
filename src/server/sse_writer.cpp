#include "server/sse_writer.h"

namespace dsv4 {

namespace {
std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}
}  // namespace

bool SseWriter::data(const nlohmann::ordered_json& j) { return send_raw("data: " + dump(j) + "\n\n"); }

bool SseWriter::event(const std::string& type, const nlohmann::ordered_json& j) {
  return send_raw("event: " + type + "\ndata: " + dump(j) + "\n\n");
}

}  // namespace dsv4
