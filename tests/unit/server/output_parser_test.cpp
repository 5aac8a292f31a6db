// OutputSplitter: reasoning, content and tool calls out of raw model text, the same whether the text
// arrives at once or a byte at a time; malformed calls stay text.
#include "server/output_parser.h"

#include <gtest/gtest.h>

#include <string>

namespace dflash::server {
namespace {

OutputDelta all_at_once(std::string_view text, bool in_reasoning, bool tools) {
  OutputSplitter s(in_reasoning, tools);
  OutputDelta d = s.push(text);
  d.append(s.finish());
  return d;
}

OutputDelta byte_by_byte(std::string_view text, bool in_reasoning, bool tools) {
  OutputSplitter s(in_reasoning, tools);
  OutputDelta d;
  for (char c : text) d.append(s.push(std::string_view(&c, 1)));
  d.append(s.finish());
  return d;
}

void expect_same(const OutputDelta& a, const OutputDelta& b, const std::string& what) {
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << what;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << what;
  }
}

TEST(OutputSplitter, reasoning_goes_to_reasoning_content) {
  for (bool bytes : {false, true}) {
    auto run = bytes ? byte_by_byte : all_at_once;
    OutputDelta d = run("<think>\nlet me see\n</think>\n\nThe answer is 4.", false, false);
    EXPECT_EQ(d.reasoning, "\nlet me see\n");
    EXPECT_EQ(d.content, "The answer is 4.");
    // The prompt opened the block (Qwen3.5/3.6 templates): the output starts inside it.
    OutputDelta o = run("hmm\n</think>\n\nYes.", true, false);
    EXPECT_EQ(o.reasoning, "hmm\n");
    EXPECT_EQ(o.content, "Yes.");
    // No think block: all content, including a "<th" that is not a tag.
    OutputDelta c = run("<th is not a tag", false, false);
    EXPECT_EQ(c.content, "<th is not a tag");
    EXPECT_TRUE(c.reasoning.empty());
    // Long leading whitespace is released as content before the end (streams must move).
    OutputSplitter ws(false, false);
    EXPECT_EQ(ws.push(std::string(40, '\n')).content, std::string(40, '\n'));
    // Reasoning never closed (max_tokens): it is all reasoning.
    OutputDelta u = run("<think>still thinking", false, false);
    EXPECT_EQ(u.reasoning, "still thinking");
  }
}

TEST(OutputSplitter, tool_calls_are_parsed_and_malformed_ones_stay_text) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>";
  for (bool bytes : {false, true}) {
    OutputDelta d = (bytes ? byte_by_byte : all_at_once)(text, false, true);
    EXPECT_EQ(d.content, "Let me check.\n");
    ASSERT_EQ(d.tool_calls.size(), 2u);
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    EXPECT_EQ(d.tool_calls[0].arguments, "{\"city\":\"Paris\"}");
    EXPECT_EQ(d.tool_calls[1].name, "get_time");
    EXPECT_EQ(d.tool_calls[1].arguments, "{\"tz\": \"CET\"}");  // a string argument is kept as given
    EXPECT_NE(d.tool_calls[0].id, d.tool_calls[1].id);
  }
  // Malformed bodies, a call never closed, tools not offered: text.
  const std::string bad = "<tool_call>\n{not json}\n</tool_call>";
  EXPECT_EQ(all_at_once(bad, false, true).content, bad);
  EXPECT_TRUE(all_at_once(bad, false, true).tool_calls.empty());
  const std::string no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
  EXPECT_EQ(all_at_once(no_name, false, true).content, no_name);
  const std::string open = "x <tool_call>{\"name\": \"f\"";
  EXPECT_EQ(all_at_once(open, false, true).content, open);
  const std::string call = "<tool_call>{\"name\": \"f\"}</tool_call>";
  EXPECT_EQ(all_at_once(call, false, false).content, call);
  EXPECT_EQ(all_at_once(call, false, true).tool_calls.at(0).arguments, "{}");
}

// Qwen3.5's XML call form: parameters become JSON arguments (JSON values keep their type).
TEST(OutputSplitter, qwen35_xml_tool_calls) {
  const std::string text =
      "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"C\"}\n</parameter>\n</function>\n</tool_call>";
  for (bool bytes : {false, true}) {
    const OutputDelta d = (bytes ? byte_by_byte : all_at_once)(text, false, true);
    EXPECT_EQ(d.content, "Checking.\n");
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    EXPECT_EQ(d.tool_calls[0].arguments, R"({"city":"Paris","days":3,"opts":{"unit":"C"}})");
  }
  // No parameters; malformed XML stays text.
  EXPECT_EQ(all_at_once("<tool_call><function=ping></function></tool_call>", false, true).tool_calls.at(0).arguments,
            "{}");
  const std::string bad = "<tool_call><function=f><parameter=a>1</function></tool_call>";
  EXPECT_EQ(all_at_once(bad, false, true).content, bad);
}

TEST(OutputSplitter, byte_by_byte_equals_all_at_once_on_mixed_text) {
  const std::string samples[] = {
      "<think>a</think>b<tool_call>{\"name\":\"x\",\"arguments\":{\"k\":[1,2]}}</tool_call>c",
      "  <think></think>\n\n<tool_call></tool_call>",
      "</think> stray close, <tool_call> and < and <tool",
      "<think>\xE4\xBD\xA0\xE5\xA5\xBD</think>\xF0\x9F\x91\x8B",
  };
  for (const auto& t : samples)
    for (bool r : {false, true})
      for (bool tools : {false, true}) expect_same(all_at_once(t, r, tools), byte_by_byte(t, r, tools), t);
}

}  // namespace
}  // namespace dflash::server
