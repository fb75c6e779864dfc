// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it (the official DeepSeek V4 encoder
// renders tool schemas, response formats and non-string tool arguments this way): separators ", " and ": ",
// object keys in insertion order (hence ordered_json), only '"', '\\' and control characters < 0x20 escaped
// (\n \r \t \b \f short forms, others \u00XX), non-ASCII kept as UTF-8, floats in Python repr() form
// (shortest round-trip digits; exponent form "1e-05" / "1e+16" outside [1e-4, 1e16); integral floats keep ".0";
// NaN / Infinity / -Infinity as Python writes them).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace dsv4 {

std::string py_json_dumps(const nlohmann::ordered_json& value);
void py_json_dump_to(const nlohmann::ordered_json& value, std::string& out);
// Python repr() of a double.
std::string py_float_repr(double v);

}  // namespace dsv4
