// API-key authentication of the HTTP server (`dsv4 serve --api-key KEY` / `--api-key-file PATH`).
//
// A request presents its key as `Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY` (Anthropic
// clients); either is accepted on every route. The comparison takes time that depends only on the length of the
// configured key, never on how much of it a guess matches (constant_time_equal).
#pragma once
#include <filesystem>
#include <string>
#include <string_view>

namespace dsv4 {

// True iff presented == secret; the running time depends on secret.size() only.
bool constant_time_equal(std::string_view presented, std::string_view secret);

// The key a request presents: the token of "Bearer <token>" in `authorization` (scheme case-insensitive), else
// `x_api_key`; empty when neither is given.
std::string presented_api_key(std::string_view authorization, std::string_view x_api_key);

// The first line of a key file, without surrounding whitespace. Throws dsv4::Error (naming the file) if it cannot
// be read or holds no key.
std::string read_api_key_file(const std::filesystem::path& path);

}  // namespace dsv4
