// An error answered to an API client: HTTP status + OpenAI error object
// {"error": {"message", "type", "param", "code"}} (param / code may be null), or on the Anthropic routes
// {"type": "error", "error": {"type", "message"}} with Anthropic's type for the status (400 invalid_request_error,
// 401 authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error,
// 503 overloaded_error, other 5xx api_error).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace dsv4 {

class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string type = "invalid_request_error", std::string param = "",
           std::string code = "")
      : Error(message), status_(status), type_(std::move(type)), param_(std::move(param)), code_(std::move(code)) {}

  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // {"error": {...}}; empty param / code become null.
  nlohmann::ordered_json to_json() const {
    return {{"error",
             {{"message", what()},
              {"type", type_},
              {"param", param_.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param_)},
              {"code", code_.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(code_)}}}};
  }
  nlohmann::ordered_json to_anthropic_json() const {
    const char* t = status_ == 400   ? "invalid_request_error"
                    : status_ == 401 ? "authentication_error"
                    : status_ == 403 ? "permission_error"
                    : status_ == 404 ? "not_found_error"
                    : status_ == 413 ? "request_too_large"
                    : status_ == 429 ? "rate_limit_error"
                    : status_ == 503 ? "overloaded_error"
                    : status_ >= 500 ? "api_error"
                                     : "invalid_request_error";
    return {{"type", "error"}, {"error", {{"type", t}, {"message", what()}}}};
  }

 private:
  int status_;
  std::string type_, param_, code_;
};

// 400 invalid_request_error naming the field.
[[noreturn]] inline void bad_request(const std::string& param, const std::string& message,
                                     const std::string& code = "") {
  throw ApiError(400, message, "invalid_request_error", param, code);
}

}  // namespace dsv4
