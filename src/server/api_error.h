// An error answered to an API client: HTTP status + OpenAI error object
// {"error": {"message", "type", "param", "code"}} (param / code may be null).
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
  // {"error": {...}}; empty param / code become null.
  nlohmann::json to_json() const {
    return {{"error",
             {{"message", what()},
              {"type", type_},
              {"param", param_.empty() ? nlohmann::json(nullptr) : nlohmann::json(param_)},
              {"code", code_.empty() ? nlohmann::json(nullptr) : nlohmann::json(code_)}}}};
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
