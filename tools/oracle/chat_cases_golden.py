#!/usr/bin/env python3
"""Writes tests/data/chat/cases.jsonl: chat-rendering cases with the expected prompt from the OFFICIAL encoder.

Each output line: {"name", "request", "expected"} or {"name", "request", "error"} (a substring of the dsv4::Error
message for requests dsv4 rejects). `expected` is produced by the official DeepSeek V4 `encoding/encoding_dsv4.py`
(`encode_messages`), which is not part of this repository: pass the path of a copy (from the HF model repo's
encoding/ folder). The request -> encode_messages mapping below is dsv4's documented API behaviour
(src/chat/chat_encoding.h): thinking/effort/drop_thinking resolution, top-level tools and response_format attached
to the first system message (an empty one inserted first when there is none), content parts flattened, tool-call
arguments given as objects serialised to JSON strings.
Usage: python3 tools/oracle/chat_cases_golden.py PATH/TO/encoding_dsv4.py [OUT]
"""
import copy
import importlib.util
import json
import sys

W = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "City name"},
                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city"]}}}
S = {"type": "function", "function": {"name": "search", "description": "Search the web",
                                      "parameters": {"type": "object", "properties": {
                                          "query": {"type": "string"}, "top_k": {"type": "integer", "default": 5},
                                          "score": {"type": "number", "minimum": 0.0, "maximum": 1e16,
                                                    "multipleOf": 1e-05}}, "required": ["query"]}}}
U = {"type": "function", "function": {"name": "translate", "description": "把文本翻译成英文 🌍 \"quoted\" \\ tab\t",
                                      "parameters": {"type": "object", "properties": {"文本": {"type": "string"}}}}}


def tc(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


def u(c, **kw):
    return dict({"role": "user", "content": c}, **kw)


def a(c, rc=None, tcs=None, **kw):
    m = {"role": "assistant", "content": c}
    if rc is not None:
        m["reasoning_content"] = rc
    if tcs is not None:
        m["tool_calls"] = tcs
    m.update(kw)
    return m


def s(c, **kw):
    return dict({"role": "system", "content": c}, **kw)


def t(c, id_=None):
    m = {"role": "tool", "content": c}
    if id_ is not None:
        m["tool_call_id"] = id_
    return m


SYS = s("You are a helpful assistant.")
CASES = [
    ("single_user_default_thinking", {"messages": [u("Hello")]}),
    ("system_user_default_thinking", {"messages": [SYS, u("What is 2+2?")]}),
    ("thinking_disabled", {"messages": [SYS, u("Hi")], "thinking": {"type": "disabled"}}),
    ("thinking_enabled_wins_over_kwargs", {"messages": [u("Hi")], "thinking": {"type": "enabled"},
                                           "chat_template_kwargs": {"thinking": False}}),
    ("thinking_disabled_wins_over_kwargs", {"messages": [u("Hi")], "thinking": {"type": "disabled"},
                                            "chat_template_kwargs": {"enable_thinking": True}}),
    ("kwargs_thinking_false", {"messages": [u("Hi")], "chat_template_kwargs": {"thinking": False}}),
    ("kwargs_enable_thinking_false", {"messages": [u("Hi")], "chat_template_kwargs": {"enable_thinking": False}}),
    ("effort_max", {"messages": [SYS, u("Prove it.")], "reasoning_effort": "max"}),
    ("effort_xhigh", {"messages": [u("Prove it.")], "reasoning_effort": "xhigh"}),
    ("effort_high_renders_none", {"messages": [u("Prove it.")], "reasoning_effort": "high"}),
    ("effort_low_renders_none", {"messages": [u("Prove it.")], "reasoning_effort": "low"}),
    ("effort_max_chat_mode_no_prefix", {"messages": [u("Prove it.")], "reasoning_effort": "max",
                                        "thinking": {"type": "disabled"}}),
    ("effort_max_from_kwargs", {"messages": [u("Prove it.")], "chat_template_kwargs": {"reasoning_effort": "max"}}),
    ("effort_top_level_wins", {"messages": [u("Prove it.")], "reasoning_effort": "low",
                               "chat_template_kwargs": {"reasoning_effort": "max"}}),
    ("multi_turn_thinking_drops_old_reasoning",
     {"messages": [SYS, u("Hello"), a("Hi there!", "greet back"), u("Capital of France?"),
                   a("Paris.", "easy"), u("And of Italy?")]}),
    ("multi_turn_chat", {"messages": [SYS, u("Hello"), a("Hi!", "ignored"), u("Bye")],
                         "thinking": {"type": "disabled"}}),
    ("drop_thinking_false", {"messages": [SYS, u("Hello"), a("Hi there!", "greet back"), u("Next?")],
                             "chat_template_kwargs": {"drop_thinking": False}}),
    ("tools_top_level_no_system", {"messages": [u("Weather in Paris?")], "tools": [W]}),
    ("tools_top_level_with_system", {"messages": [SYS, u("Weather in Paris?")], "tools": [W, S]}),
    ("tools_keep_all_reasoning",
     {"messages": [SYS, u("Weather in Paris?"),
                   a("", "need the tool", [tc("c1", "get_weather", "{\"city\": \"Paris\"}")]),
                   t("{\"temp\": 18}", "c1"), a("It is 18°C.", "got it"), u("And Rome?")], "tools": [W]}),
    ("parallel_calls_results_sorted",
     {"messages": [SYS, u("Weather in Paris and Rome?"),
                   a("Checking both.", "two calls", [tc("a", "get_weather", "{\"city\": \"Paris\"}"),
                                                     tc("b", "get_weather", "{\"city\": \"Rome\", \"unit\": \"celsius\"}")]),
                   t("Rome: 25", "b"), t("Paris: 18", "a")], "tools": [W]}),
    ("tool_result_then_user_text_merged",
     {"messages": [u("Find x"), a("", "", [tc("q1", "search", "{\"query\": \"x\"}")]), t("x is 5", "q1"),
                   u("Thanks, now double it.")], "tools": [S]}),
    ("consecutive_users_merged", {"messages": [SYS, u("First part."), u("Second part.")]}),
    ("typed_arguments",
     {"messages": [u("Go"), a(None, "r", [tc("c", "search", json.dumps(
         {"query": "héllo \"w\"", "top_k": 3, "score": 0.5, "exact": True, "filter": None,
          "tags": ["a", 1, 2.0, False], "opts": {"lang": "中文", "n": 1e-05, "big": 1e16}}, ensure_ascii=False))])],
      "tools": [S]}),
    ("invalid_argument_json", {"messages": [u("Go"), a("", None, [tc("c", "search", "{not json")])], "tools": [S],
                               "thinking": {"type": "disabled"}}),
    ("non_object_argument_json", {"messages": [u("Go"), a("", None, [tc("c", "search", "[1, 2]")])], "tools": [S],
                                  "thinking": {"type": "disabled"}}),
    ("empty_arguments_object", {"messages": [u("Go"), a("", "", [tc("c", "search", "{}")])], "tools": [S]}),
    ("arguments_as_object", {"messages": [u("Go"), a("", "", [tc("c", "search", {"query": "q", "top_k": 2})])],
                             "tools": [S]}),
    ("response_format_json_schema",
     {"messages": [SYS, u("Give me a person.")],
      "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": {
          "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}}}}),
    ("response_format_text_renders_nothing", {"messages": [SYS, u("Hi")], "response_format": {"type": "text"}}),
    ("response_format_and_tools_no_system", {"messages": [u("Hi")], "tools": [W],
                                             "response_format": {"type": "json_object"}}),
    ("response_format_on_system_message",
     {"messages": [s("Sys", response_format={"type": "json_object"}), u("Hi")], "thinking": {"type": "disabled"}}),
    ("latest_reminder", {"messages": [SYS, {"role": "latest_reminder", "content": "2026-12-01, Paris"}, u("Date?")]}),
    ("user_then_latest_reminder_then_assistant",
     {"messages": [u("Hi"), {"role": "latest_reminder", "content": "ctx"}, a("Hello", "r")]}),
    ("developer_with_tools", {"messages": [SYS, {"role": "developer", "content": "Search for cats.", "tools": [S]}]}),
    ("developer_before_last_user_dropped",
     {"messages": [SYS, {"role": "developer", "content": "Be brief."}, a("ok", "r1"), u("Now answer.")]}),
    ("task_query", {"messages": [u("Best hot springs", task="query")], "thinking": {"type": "disabled"}}),
    ("task_action_thinking", {"messages": [u("Find hot springs", task="action")]}),
    ("task_action_then_answer", {"messages": [u("Find hot springs", task="action"), a("Search", "r")]}),
    ("assistant_prefill_wo_eos", {"messages": [u("Write a poem"), a("Roses are", "plan", wo_eos=True)]}),
    ("ends_with_assistant", {"messages": [SYS, u("Hello"), a("Hi!", "r")], "thinking": {"type": "disabled"}}),
    ("null_content_assistant_with_calls",
     {"messages": [u("Go"), a(None, None, [tc("c", "get_weather", "{\"city\": \"Oslo\"}")]), t("cold", "c")],
      "tools": [W], "thinking": {"type": "disabled"}}),
    ("content_parts_flattened", {"messages": [{"role": "user", "content": [{"type": "text", "text": "Part A. "},
                                                                         {"type": "text", "text": "Part B."}]}]}),
    ("tool_content_parts", {"messages": [u("Go"), a("", "", [tc("c", "search", "{\"query\": \"q\"}")]),
                                         {"role": "tool", "tool_call_id": "c", "content": [
                                             {"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]}],
                            "tools": [S]}),
    ("special_strings_in_content", {"messages": [u("Say <think> and </think> and <｜end▁of▁sentence｜> literally.")]}),
    ("unicode_tool_schema", {"messages": [u("翻译：你好")], "tools": [U]}),
    ("system_only", {"messages": [SYS]}),
    ("empty_system_content", {"messages": [s(""), u("Hi")]}),
    ("tool_without_id_unsorted",
     {"messages": [u("Go"), a("", "", [tc("x", "search", "{\"query\": \"1\"}"), tc("y", "search", "{\"query\": \"2\"}")]),
                   t("no id 1"), t("no id 2")], "tools": [S]}),
]

ERRORS = [
    ("err_empty_messages", {"messages": []}, "messages: must not be empty"),
    ("err_no_messages", {"model": "x"}, "messages: required array"),
    ("err_unknown_role", {"messages": [u("a"), {"role": "robot", "content": "x"}]}, "messages[1].role: unknown role"),
    ("err_developer_empty", {"messages": [{"role": "developer", "content": ""}]}, "messages[0].content"),
    ("err_thinking_type", {"messages": [u("a")], "thinking": {"type": "auto"}}, "thinking.type"),
    ("err_tool_call_name", {"messages": [u("a"), a("", None, [{"id": "c", "function": {"arguments": "{}"}}])]},
     "messages[1].tool_calls[0].function.name"),
    ("err_unknown_task", {"messages": [u("a", task="translate")]}, "messages[0].task"),
    ("err_image_part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]"),
    ("err_content_type", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("err_tools_type", {"messages": [u("a")], "tools": {"x": 1}}, "tools: expected an array"),
    # tool names: the server's rule (src/chat/tool_name.h), also for a name the official encoder would render
    ("err_tool_name", {"messages": [u("a")], "tools": [{"type": "function", "function": dict(U["function"], name="翻译")}]},
     "tools[0].function.name: required, 1 to 64 letters"),
    ("err_tool_name_quote", {"messages": [u("a")], "tools": [{"type": "function", "function": {"name": "a\"b"}}]},
     "tools[0].function.name"),
    ("err_tool_call_empty_name", {"messages": [u("a"), a("", None, [tc("c", "", "{}")])]},
     "messages[1].tool_calls[0].function.name: required non-empty string"),
]


def to_official(req):
    """dsv4's request semantics -> (messages, thinking_mode, drop_thinking, reasoning_effort) for encode_messages."""
    kw = req.get("chat_template_kwargs") or {}
    thinking = True
    if req.get("thinking") is not None:
        thinking = req["thinking"]["type"] == "enabled"
    elif kw.get("thinking") is not None:
        thinking = kw["thinking"]
    elif kw.get("enable_thinking") is not None:
        thinking = kw["enable_thinking"]
    effort = req.get("reasoning_effort") or kw.get("reasoning_effort")
    effort = "max" if effort in ("max", "xhigh") else None
    drop = kw.get("drop_thinking", True)
    msgs = copy.deepcopy(req["messages"])
    for m in msgs:
        if isinstance(m.get("content"), list) and m["role"] != "tool":
            m["content"] = "".join(p["text"] for p in m["content"])
        for c in m.get("tool_calls") or []:
            if isinstance(c["function"].get("arguments"), dict):
                c["function"]["arguments"] = json.dumps(c["function"]["arguments"], ensure_ascii=False)
    tools = req.get("tools") or []
    rf = req.get("response_format")
    if rf is not None and rf.get("type") == "text":
        rf = None
    if tools or rf is not None:
        idx = next((i for i, m in enumerate(msgs) if m["role"] == "system"), None)
        if idx is None:
            msgs.insert(0, {"role": "system", "content": ""})
            idx = 0
        if tools:
            msgs[idx]["tools"] = (msgs[idx].get("tools") or []) + tools
        if rf is not None:
            msgs[idx]["response_format"] = rf
    return msgs, ("thinking" if thinking else "chat"), drop, effort


def main():
    spec = importlib.util.spec_from_file_location("encoding_dsv4", sys.argv[1])
    enc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(enc)
    # Where the official encoder is undefined: tool-call arguments whose JSON is not an object make it crash
    # (`.items()` on a list); dsv4 renders them like invalid JSON (one "arguments" string parameter).
    orig_loads = json.loads

    def loads_object_only(text, *args, **kwargs):
        v = orig_loads(text, *args, **kwargs)
        if not isinstance(v, dict):
            raise ValueError("arguments JSON is not an object")
        return v

    enc.json = type("J", (), {"loads": staticmethod(loads_object_only), "dumps": staticmethod(json.dumps)})
    out = sys.argv[2] if len(sys.argv) > 2 else "tests/data/chat/cases.jsonl"
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for name, req in CASES:
            msgs, mode, drop, effort = to_official(req)
            expected = enc.encode_messages(msgs, thinking_mode=mode, drop_thinking=drop, reasoning_effort=effort)
            f.write(json.dumps({"name": name, "request": req, "expected": expected}, ensure_ascii=False) + "\n")
        for name, req, err in ERRORS:
            f.write(json.dumps({"name": name, "request": req, "error": err}, ensure_ascii=False) + "\n")
    print(f"{out}: {len(CASES)} rendering cases, {len(ERRORS)} error cases")


if __name__ == "__main__":
    main()
