// Grammar of the answer when tool calls are constrained: the DSML tool-call block of DeepSeek V4
// (chat/dsv4_format.h, parsed by chat/output_parser.h), with arguments that validate against each tool's schema.
//
//   BLOCK   := ("\n\n")? "<｜DSML｜tool_calls>\n" INVOKE ("\n" INVOKE)* "\n</｜DSML｜tool_calls>"
//              (exactly one INVOKE when parallel calls are off)
//   INVOKE  := "<｜DSML｜invoke name=\"" NAME "\">\n" PARAMS "\n</｜DSML｜invoke>"   one alternative per allowed tool
//   PARAMS  := the tool's `parameters.properties` in schema order, required ones always, optional ones may be left
//              out, each on its own line:
//     "<｜DSML｜parameter name=\"K\" string=\"true\">" RAW "</｜DSML｜parameter>"   a string parameter without length
//              bounds (RAW: UTF-8 text that does not contain "</｜DSML｜parameter>"), or a string enum (its values);
//     "<｜DSML｜parameter name=\"K\" string=\"false\">" JSON "</｜DSML｜parameter>"  any other parameter: a JSON value
//              valid against the parameter's schema (json_schema_grammar.h in lenient mode: keywords it does not
//              support are ignored, as OpenAI accepts any schema for tools).
//              A tool without a parameters schema takes none; one whose schema lists no properties takes any
//              parameters (names without '"' or newlines) unless additionalProperties is false.
//   Modes:  required: BLOCK over all tools;  named: BLOCK over that tool only;
//           auto (used when parallel calls are off, or with a JSON response format): TEXT [BLOCK], TEXT being UTF-8
//           text without "｜DSML｜"; with `json_answer` the alternative to BLOCK is the JSON document instead of TEXT.
// The grammar ends after the block (the model then writes EOS). Throws ApiError 400 naming the tool field whose
// schema cannot be compiled (for example an invalid $ref).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sampling/grammar.h"

namespace dsv4 {

struct ToolSpec {
  std::string name;
  nlohmann::ordered_json parameters;  // JSON Schema object (or null: no parameters)
  std::string path;                   // request location of the function object, for errors ("tools[0].function")
};

enum class ToolMode { kAuto, kRequired, kNamed };

struct ToolGrammarOptions {
  ToolMode mode = ToolMode::kRequired;
  std::string name;      // kNamed
  bool parallel = true;  // false: exactly one call
  // kAuto: the answer is either this JSON document (response_format) or the block; null: free text or the block.
  const nlohmann::ordered_json* json_answer = nullptr;
  std::string json_answer_path;
};

Grammar tool_call_grammar(const std::vector<ToolSpec>& tools, const ToolGrammarOptions& opts);

}  // namespace dsv4
