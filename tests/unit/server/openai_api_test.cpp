// Request parsing and validation of the OpenAI routes, the response shapes, and stop-string matching.
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <cmath>

#include "server/responses_api.h"

#include <string>

namespace dflash::server {
namespace {

using json = nlohmann::json;

TEST(ChatRequest, parses_messages_sampling_stop_and_stream_options) {
  auto r = parse_chat_request(R"({"model":"m","messages":[{"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
      "temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":7,"presence_penalty":0.5,
      "max_completion_tokens":12,"stop":["\n\n","END"],"stream":true,"stream_options":{"include_usage":true},
      "chat_template_kwargs":{"enable_thinking":false}})",
                              4096);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->model, "m");
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[0]["role"], "system");  // developer is the system role
  EXPECT_EQ(r->messages[1]["content"], "hi there");
  EXPECT_FLOAT_EQ(r->gen.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r->gen.sampling.top_p, 0.9f);
  EXPECT_EQ(r->gen.sampling.top_k, 40);
  EXPECT_EQ(r->gen.sampling.seed, 7u);
  EXPECT_EQ(r->gen.max_tokens, 12);
  EXPECT_EQ(r->gen.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(r->template_kwargs["enable_thinking"], false);
}

TEST(ChatRequest, defaults_follow_openai) {
  auto r = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}]})", 4096);
  ASSERT_TRUE(r.ok());
  EXPECT_FLOAT_EQ(r->gen.sampling.temperature, 1.0f);
  EXPECT_EQ(r->gen.max_tokens, -1);  // the server fills in what the context leaves
  EXPECT_FALSE(r->stream);
  auto s = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"stop":"##","reasoning_effort":"none"})",
                              4096);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->gen.stop, std::vector<std::string>{"##"});
  EXPECT_EQ(s->template_kwargs["enable_thinking"], false);
}

// Every malformed field is a 4xx naming it; nothing throws.
TEST(ChatRequest, malformed_requests_are_client_errors_naming_the_field) {
  const std::pair<const char*, const char*> cases[] = {
      {"{", "not valid JSON"},
      {"[1]", "JSON object"},
      {R"({})", "'messages'"},
      {R"({"messages":[]})", "'messages'"},
      {R"({"messages":"hi"})", "'messages'"},
      {R"({"messages":[3]})", "'messages[0]'"},
      {R"({"messages":[{"content":"x"}]})", "'messages[0].role'"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", "'messages[0].role'"},
      {R"({"messages":[{"role":"user","content":5}]})", "'messages[0].content'"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "'messages[0].content[0].type'"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "'temperature'"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":3})", "'temperature'"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_p":0})", "'top_p'"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_k":-1})", "'top_k'"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-5})", "'max_tokens'"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", "'max_tokens'"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1e9})", "'max_tokens'"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":999999})", "'max_tokens'"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", "'stop'"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]})", "'stop'"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":2})", "'n'"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", "'stream'"},
      {R"({"messages":[{"role":"user","content":"x"}],"seed":"s"})", "'seed'"},
      {R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]})", "'chat_template_kwargs'"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "'tools[0]'"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":{}})", "'tools'"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "'tool_choice'"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes","tools":[{"type":"function","function":{"name":"f"}}]})",
       "'tool_choice'"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"g"}},"tools":[{"type":"function","function":{"name":"f"}}]})",
       "'tool_choice'"},
      {R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", "'messages[0].tool_calls'"},
      {R"({"messages":[{"role":"assistant","content":"x","tool_calls":[{"function":{}}]}]})",
       "'messages[0].tool_calls[0]'"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":"yes"})", "'logprobs'"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", "'top_logprobs'"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})",
       "'response_format'"},
      {R"({"messages":[{"role":"user","content":"x"}],"model":3})", "'model'"},
  };
  for (const auto& [body, needle] : cases) {
    auto r = parse_chat_request(body, 4096);
    ASSERT_FALSE(r.ok()) << body;
    const int status = http_status_for(r.status());
    EXPECT_GE(status, 400) << body;
    EXPECT_LT(status, 500) << body;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << body << " -> " << r.status().message();
    const json e = error_body(r.status());
    EXPECT_EQ(e["error"]["type"], "invalid_request_error") << body;
  }
}

// response_format: text (the default) or json_object; json_schema and anything else are a 400 whose
// error body names the param.
// logit_bias: token id -> bias in [-100, 100], -100 a ban (-inf); anything else a 400 naming the field.
TEST(ChatRequest, logit_bias_maps_ids_to_biases_and_minus_100_bans) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  auto r = parse_chat_request("{" + msgs + R"(,"logit_bias":{"5":2.5,"7":-100,"11":-3}})", 4096);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const auto& b = r->gen.sampling.logit_bias;
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b.at(5), 2.5f);
  EXPECT_TRUE(std::isinf(b.at(7)) && b.at(7) < 0);
  EXPECT_EQ(b.at(11), -3.0f);
  for (const char* bad : {R"([1])", R"({"x":1})", R"({"-1":1})", R"({"1.5":1})", R"({"3":101})", R"({"3":"1"})",
                          R"({"99999999999":1})", R"({"":1})"}) {
    auto e = parse_chat_request("{" + msgs + R"(,"logit_bias":)" + bad + "}", 4096);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(http_status_for(e.status()), 400) << bad;
    EXPECT_EQ(error_body(e.status())["error"]["param"], "logit_bias") << bad;
  }
}

TEST(ChatRequest, response_format_is_text_or_json_object) {
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  auto plain = parse_chat_request("{" + msgs + "}", 4096);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->gen.json_object);
  for (const char* rf : {R"({"type":"text"})", "null"}) {
    auto r = parse_chat_request("{" + msgs + R"(,"response_format":)" + rf + "}", 4096);
    ASSERT_TRUE(r.ok()) << rf << ": " << r.status().to_string();
    EXPECT_FALSE(r->gen.json_object) << rf;
  }
  auto j = parse_chat_request("{" + msgs + R"(,"response_format":{"type":"json_object"}})", 4096);
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  EXPECT_TRUE(j->gen.json_object);
  auto c = parse_completion_request(R"({"prompt":"x","response_format":{"type":"json_object"}})", 4096);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->gen.json_object);
  auto ct = parse_completion_request(R"({"prompt":"x","response_format":{"type":"text"}})", 4096);
  ASSERT_TRUE(ct.ok());
  EXPECT_FALSE(ct->gen.json_object);

  const std::pair<const char*, const char*> bad[] = {
      {R"({"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object"}}})", "not supported yet"},
      {R"("json_object")", "must be an object"},
      {R"([{"type":"json_object"}])", "must be an object"},
      {R"({})", "'type'"},
      {R"({"type":5})", "'type'"},
      {R"({"type":"xml"})", "'xml' is not one of text, json_object"},
  };
  for (const auto& [rf, needle] : bad) {
    for (bool chat : {true, false}) {
      const std::string body = chat ? "{" + msgs + R"(,"response_format":)" + rf + "}"
                                    : std::string(R"({"prompt":"x","response_format":)") + rf + "}";
      const Status st = chat ? parse_chat_request(body, 4096).status() : parse_completion_request(body, 4096).status();
      ASSERT_FALSE(st.ok()) << body;
      EXPECT_EQ(http_status_for(st), 400) << body;
      EXPECT_NE(st.message().find("'response_format'"), std::string::npos) << st.message();
      EXPECT_NE(st.message().find(needle), std::string::npos) << body << " -> " << st.message();
      const json e = error_body(st);
      EXPECT_EQ(e["error"]["type"], "invalid_request_error") << body;
      EXPECT_EQ(e["error"]["param"], "response_format") << body;
    }
  }
  // json_schema's message points to what works.
  auto schema = parse_chat_request("{" + msgs + R"(,"response_format":{"type":"json_schema"}})", 4096);
  EXPECT_NE(schema.status().message().find("json_object"), std::string::npos) << schema.status().message();
}

TEST(ErrorBody, names_the_param_of_a_field_error_unless_given) {
  EXPECT_EQ(error_body(field_error("top_k", "must be a non-negative integer"))["error"]["param"], "top_k");
  EXPECT_EQ(error_body(field_error("top_k", "x"), "other")["error"]["param"], "other");
  EXPECT_TRUE(error_body(invalid_argument("the body is not valid JSON"))["error"]["param"].is_null());
  EXPECT_TRUE(error_body(internal_error("'x' broke"))["error"]["param"].is_null());  // not a client error
}

TEST(ResponsesRequest, text_format_is_text_or_json_object) {
  const std::string input = R"("input":"give me JSON")";
  for (const char* text : {"", R"(,"text":{"format":{"type":"text"}})", R"(,"text":{})", R"(,"text":null)"}) {
    auto r = parse_responses_request("{" + input + text + "}", 4096);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().to_string();
    EXPECT_FALSE(r->chat.gen.json_object) << text;
    EXPECT_EQ(r->echo["text"]["format"]["type"], "text");
  }
  auto j = parse_responses_request("{" + input + R"(,"text":{"format":{"type":"json_object"}}})", 4096);
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  EXPECT_TRUE(j->chat.gen.json_object);
  EXPECT_EQ(j->echo["text"]["format"]["type"], "json_object");  // the response object reports it

  const std::pair<const char*, const char*> bad[] = {
      {R"("text":"json")", "'text'"},
      {R"("text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"}}})", "'text.format'"},
      {R"("text":{"format":"json_object"})", "'text.format'"},
      {R"("text":{"format":{}})", "'text.format'"},
      {R"("text":{"format":{"type":"yaml"}})", "'text.format'"},
  };
  for (const auto& [field, needle] : bad) {
    const std::string body = "{" + input + "," + field + "}";
    auto r = parse_responses_request(body, 4096);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(http_status_for(r.status()), 400) << body;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << body << " -> " << r.status().message();
    EXPECT_EQ(error_body(r.status())["error"]["type"], "invalid_request_error");
  }
  auto schema = parse_responses_request("{" + input + R"(,"text":{"format":{"type":"json_schema"}}})", 4096);
  EXPECT_NE(schema.status().message().find("not supported yet"), std::string::npos) << schema.status().message();
  EXPECT_EQ(error_body(schema.status())["error"]["param"], "text.format");
}

TEST(ChatRequest, tools_tool_choice_and_tool_messages) {
  auto r = parse_chat_request(R"({"messages":[
      {"role":"user","content":"weather?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"sunny"}],
      "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],
      "tool_choice":{"type":"function","function":{"name":"get_weather"}}})",
                              4096);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tool_choice, "function");
  EXPECT_EQ(r->tool_name, "get_weather");
  ASSERT_TRUE(r->tools.is_array());
  const auto& call = r->messages[1]["tool_calls"][0];
  EXPECT_EQ(call["function"]["arguments"]["city"], "Paris");  // parsed for the template
  EXPECT_EQ(r->messages[2]["tool_call_id"], "c1");
  EXPECT_EQ(r->messages[2]["content"], "sunny");
}

TEST(ChatResponse, assistant_message_and_deltas_carry_reasoning_and_tool_calls) {
  OutputDelta d;
  d.reasoning = "hmm";
  d.tool_calls.push_back({"call_0", "f", "{\"a\":1}"});
  const json m = assistant_message(d);
  EXPECT_TRUE(m["content"].is_null());
  EXPECT_EQ(m["reasoning_content"], "hmm");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
  const auto deltas = delta_objects(d, 2);
  ASSERT_EQ(deltas.size(), 2u);
  EXPECT_EQ(deltas[0]["reasoning_content"], "hmm");
  EXPECT_EQ(deltas[1]["tool_calls"][0]["index"], 2);
}

TEST(ChatResponse, has_the_openai_shape_with_usage_and_timings) {
  GenerationResult r;
  r.text = "hello";
  r.finish_reason = "stop";
  r.prompt_tokens = 10;
  r.completion_tokens = 3;
  r.prefill_ms = 5;
  r.decode_ms = 30;
  const json c = chat_completion("id1", "m", 123, r);
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c["usage"]["total_tokens"], 13);
  EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_DOUBLE_EQ(c["timings"]["predicted_per_second"].get<double>(), 100.0);
  const json k = chat_chunk("id1", "m", 123, json{{"content", "x"}});
  EXPECT_EQ(k["object"], "chat.completion.chunk");
  EXPECT_TRUE(k["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(chat_chunk("id1", "m", 123, json::object(), "length")["choices"][0]["finish_reason"], "length");
}

TEST(StopMatcher, holds_back_possible_prefixes_and_cuts_at_the_first_stop) {
  StopMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.push("hello E"), "hello ");  // "E" may start END
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("X more"), "ENX more");  // not a stop after all
  EXPECT_EQ(m.push("\n"), "");
  EXPECT_EQ(m.push("\nafter"), "");  // "\n\n": stop, nothing after it
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.flush(), "");
  StopMatcher n({"END"});
  EXPECT_EQ(n.push("abcEN"), "abc");
  EXPECT_FALSE(n.stopped());
  EXPECT_EQ(n.flush(), "EN");  // the end of generation releases what was held
  StopMatcher none({});
  EXPECT_EQ(none.push("anything"), "anything");
  // UTF-8: a held-back tail never splits a character.
  StopMatcher u({"\xC3\xA9X"});  // "éX"
  EXPECT_EQ(u.push("caf\xC3\xA9"), "caf");
  EXPECT_EQ(u.push("!"), "\xC3\xA9!");
  StopMatcher w({"bc"});
  EXPECT_EQ(w.push("abcd"), "a");  // found inside one push
  EXPECT_TRUE(w.stopped());
}

}  // namespace
}  // namespace dflash::server
