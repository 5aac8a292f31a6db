// Splits a chat model's raw output into what the OpenAI API returns separately: reasoning (Qwen3's
// <think>...</think>) into reasoning_content, tool calls into tool_calls with arguments as a JSON string
// (inside <tool_call>...</tool_call>: Qwen3's JSON {"name", "arguments"}, or Qwen3.5's XML
// <function=NAME><parameter=KEY>VALUE</parameter></function>), the rest into content.
// Incremental, for streaming: text that could still be the start of a tag is held back until it is
// decided. A tool call whose body is not a JSON object with a string "name" stays text (never an error).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dflash::server {

struct ToolCall {
  std::string id;         // call_<n>
  std::string name;
  std::string arguments;  // JSON text
};

struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  // Appends a later piece of the same output.
  void append(const OutputDelta& later) {
    reasoning += later.reasoning;
    content += later.content;
    tool_calls.insert(tool_calls.end(), later.tool_calls.begin(), later.tool_calls.end());
  }
};

class OutputSplitter {
 public:
  // in_reasoning: the prompt already opened the think block (the template ended with "<think>").
  // parse_tools: the request offered tools.
  OutputSplitter(bool in_reasoning, bool parse_tools, std::string id_prefix = "call_");
  OutputDelta push(std::string_view text);
  // The end of generation: whatever is held back is released as the text it is.
  OutputDelta finish();
  int tool_call_count() const { return calls_; }

 private:
  enum class State { kStart, kReasoning, kContent, kToolCall };
  void run(OutputDelta& out, bool final);

  State state_;
  bool parse_tools_;
  bool trim_newlines_ = false;  // drop the newlines right after </think>
  std::string buf_;
  std::string id_prefix_;
  int calls_ = 0;
};

}  // namespace dflash::server
