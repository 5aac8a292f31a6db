// `dflash serve` end to end: the real binary on the tiny Qwen3 fixture, driven over HTTP. Health, models,
// chat completions (plain and streamed, which must agree), tokenize/detokenize, API keys, and malformed
// requests, each answered with an OpenAI-style error while the server stays up.
#include <httplib.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <csignal>
#include <functional>
#include <map>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "decode/json_constraint.h"
#include "state/snapshot_file.h"
#include "support/process.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

using json = nlohmann::json;

class Serve : public ::testing::Test {
 protected:
  void start(std::vector<std::string> extra = {}) {
    log_ = scratch() + "/serve.log";
    std::string why;
    port_ = test::start_listening(
        [&](int port) {
          std::vector<std::string> argv = {DFLASH_BIN, "serve"};
          if (!bundled_) argv.push_back(model_.empty() ? test::fixture_path("models/tiny-qwen3") : model_);
          argv.insert(argv.end(), {"--port", std::to_string(port), "--threads", "1"});
          argv.insert(argv.end(), extra.begin(), extra.end());
          return argv;
        },
        log_, &proc_, &why);
    ASSERT_GT(port_, 0) << why;
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_->set_read_timeout(60, 0);
    for (int i = 0; i < 300; ++i) {  // up to 30 s
      auto r = client_->Get("/health");
      if (r && r->status == 200) return;
      ASSERT_TRUE(proc_->running()) << "the server exited; see " << log_;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << "the server did not become healthy; see " << log_;
  }
  json post(const std::string& path, const std::string& body, int* status, const httplib::Headers& h = {}) {
    auto r = client_->Post(path, h, body, "application/json");
    if (!r) {
      *status = -1;
      return json();
    }
    *status = r->status;
    return json::parse(r->body, nullptr, false);
  }
  // POSTs a chat completion on its own connection; `receiver` sees the response body as it arrives and
  // hangs up by returning false.
  void post_until_hang_up(const std::string& body, std::function<bool(const char*, size_t)> receiver) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = body;
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) { return receiver(data, n); };
    c.send(req);
  }
  // After a hang-up: the engine frees its slot (a 2-token request is served within `tries` tenths of a
  // second) and counts one failed request.
  void expect_cancelled_and_free(int tries) {
    int status = 0;
    for (int i = 0; i < tries; ++i) {
      post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2})", &status);
      if (status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(status, 200);
    auto m = client_->Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_NE(m->body.find("dflash_requests_failed_total 1"), std::string::npos) << m->body;
  }
  void expect_alive() {
    auto r = client_->Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_TRUE(proc_->running());
  }

  // The test's scratch directory (made once: test::scratch_dir() starts it afresh).
  const std::string& scratch() {
    if (scratch_.empty()) scratch_ = test::scratch_dir();
    return scratch_;
  }
  std::string scratch_;
  int port_ = 0;
  std::string model_;  // default: the tiny Qwen3 fixture
  bool bundled_ = false;  // no model argument: the bundled default model
  std::string log_;
  std::unique_ptr<test::ChildProcess> proc_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(Serve, chat_completion_plain_and_streamed_agree) {
  start();
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny-qwen3");

  const std::string req = R"({"model":"tiny-qwen3","messages":[{"role":"user","content":"hello there"}],
                              "max_tokens":12,"temperature":0})";
  int status = 0;
  const json plain = post("/v1/chat/completions", req, &status);
  ASSERT_EQ(status, 200) << plain.dump();
  EXPECT_EQ(plain["object"], "chat.completion");
  EXPECT_EQ(plain["choices"][0]["message"]["role"], "assistant");
  const std::string text = plain["choices"][0]["message"]["content"];
  EXPECT_EQ(plain["usage"]["completion_tokens"].get<int>() <= 12, true);
  EXPECT_GT(plain["usage"]["prompt_tokens"].get<int>(), 3);
  const std::string fr = plain["choices"][0]["finish_reason"];
  EXPECT_TRUE(fr == "length" || fr == "stop");
  if (fr == "length") {
    EXPECT_EQ(plain["usage"]["completion_tokens"], 12);
  }

  // Greedy is deterministic: the same request again, streamed, gives the same text in deltas.
  const std::string sreq = R"({"messages":[{"role":"user","content":"hello there"}],"max_tokens":12,
                               "temperature":0,"stream":true,"stream_options":{"include_usage":true}})";
  auto r = client_->Post("/v1/chat/completions", sreq, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  std::string streamed, finish;
  bool done = false, role = false, usage = false;
  size_t pos = 0;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string payload = r->body.substr(pos + 6, end - pos - 6);
    pos = end;
    ASSERT_FALSE(done) << "data after [DONE]";
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    const json c = json::parse(payload);
    if (c.contains("usage")) {
      usage = true;
      EXPECT_EQ(c["usage"]["completion_tokens"], plain["usage"]["completion_tokens"]);
      continue;
    }
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    const json& d = c["choices"][0]["delta"];
    if (d.contains("role")) role = true;
    if (d.contains("content")) streamed += d["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done && role && usage);
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(finish, fr);
}

TEST_F(Serve, stop_strings_tokenize_and_template_routes) {
  start();
  int status = 0;
  const json tok = post("/tokenize", R"({"content":"hello world"})", &status);
  ASSERT_EQ(status, 200);
  ASSERT_TRUE(tok["tokens"].is_array());
  const json detok = post("/detokenize", json{{"tokens", tok["tokens"]}}.dump(), &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(detok["content"], "hello world");
  const json tmpl = post("/apply-template", R"({"messages":[{"role":"user","content":"hi"}]})", &status);
  ASSERT_EQ(status, 200);
  EXPECT_NE(tmpl["prompt"].get<std::string>().find("hi"), std::string::npos);

  // A stop string that the greedy output contains cuts it there.
  const json full = post("/v1/chat/completions",
                         R"({"messages":[{"role":"user","content":"abc"}],"max_tokens":16,"temperature":0})", &status);
  ASSERT_EQ(status, 200);
  const std::string text = full["choices"][0]["message"]["content"];
  if (text.size() >= 3) {
    const std::string stop = text.substr(1, 2);
    const json cut = post("/v1/chat/completions",
                          json{{"messages", {{{"role", "user"}, {"content", "abc"}}}},
                               {"max_tokens", 16},
                               {"temperature", 0},
                               {"stop", stop}}
                              .dump(),
                          &status);
    ASSERT_EQ(status, 200);
    EXPECT_EQ(cut["choices"][0]["message"]["content"], text.substr(0, text.find(stop)));
    EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
  }
}

TEST_F(Serve, completions_props_and_metrics) {
  start();
  int status = 0;
  const json c = post("/v1/completions", R"({"prompt":"The capital of","max_tokens":6,"temperature":0})", &status);
  ASSERT_EQ(status, 200) << c.dump();
  EXPECT_EQ(c["object"], "text_completion");
  const std::string text = c["choices"][0]["text"];
  EXPECT_LE(c["usage"]["completion_tokens"].get<int>(), 6);
  // The same prompt as token ids gives the same text.
  const json tok = post("/tokenize", R"({"content":"The capital of"})", &status);
  const json c2 = post("/v1/completions", json{{"prompt", tok["tokens"]}, {"max_tokens", 6}, {"temperature", 0}}.dump(),
                       &status);
  ASSERT_EQ(status, 200) << c2.dump();
  EXPECT_EQ(c2["choices"][0]["text"], text);
  // Streamed.
  auto r = client_->Post("/v1/completions", R"({"prompt":"The capital of","max_tokens":6,"temperature":0,"stream":true})",
                         "application/json");
  ASSERT_TRUE(r);
  std::string streamed;
  size_t pos = 0;
  while ((pos = r->body.find("data: {", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    const json k = json::parse(r->body.substr(pos + 6, end - pos - 6));
    streamed += k["choices"][0]["text"].get<std::string>();
    pos = end;
  }
  EXPECT_EQ(streamed, text);
  EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos);
  // Default max_tokens for completions is OpenAI's 16.
  const json d = post("/v1/completions", R"({"prompt":"x","temperature":0})", &status);
  EXPECT_LE(d["usage"]["completion_tokens"].get<int>(), 16);
  EXPECT_EQ(post("/v1/completions", R"({"prompt":5})", &status).contains("error"), true);
  EXPECT_EQ(status, 400);

  auto props = client_->Get("/props");
  ASSERT_TRUE(props);
  const json p = json::parse(props->body);
  EXPECT_EQ(p["model"], "tiny-qwen3");
  EXPECT_EQ(p["runtime"]["backend"], "cpu");
  EXPECT_EQ(p["runtime"]["draft_residency"], "none");
  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("dflash_requests_total 5"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("# TYPE dflash_generated_tokens_total counter"), std::string::npos);
  EXPECT_NE(metrics->body.find("dflash_model_loaded 1"), std::string::npos);
}

// Tools reach the template; a forced call (tool_choice required) on a model that cannot write one
// degrades to text, never to an error.
TEST_F(Serve, tools_reach_the_template_and_bad_calls_degrade_to_text) {
  start();
  const json tools = json::array({{{"type", "function"},
                                   {"function", {{"name", "get_weather"},
                                                 {"description", "Weather of a city"},
                                                 {"parameters", {{"type", "object"}}}}}}});
  int status = 0;
  const json t = post("/apply-template",
                      json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", tools}}.dump(), &status);
  ASSERT_EQ(status, 200) << t.dump();
  EXPECT_NE(t["prompt"].get<std::string>().find("get_weather"), std::string::npos);
  for (const char* choice : {"auto", "required", "none"}) {
    const json c = post("/v1/chat/completions",
                        json{{"messages", {{{"role", "user"}, {"content", "weather in Paris?"}}}},
                             {"tools", tools},
                             {"tool_choice", choice},
                             {"max_tokens", 8},
                             {"temperature", 0}}
                            .dump(),
                        &status);
    ASSERT_EQ(status, 200) << choice << ": " << c.dump();
    const json& msg = c["choices"][0]["message"];
    EXPECT_EQ(msg["role"], "assistant");
    if (std::string(choice) == "required" && !msg.contains("tool_calls")) {
      EXPECT_EQ(msg["content"].get<std::string>().rfind("<tool_call>", 0), 0u) << msg.dump();
    }
  }
  expect_alive();
}

TEST_F(Serve, logprobs_are_the_models_log_softmax) {
  start();
  int status = 0;
  const json c = post("/v1/chat/completions",
                      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,
                          "logprobs":true,"top_logprobs":3})",
                      &status);
  ASSERT_EQ(status, 200) << c.dump();
  const json& lp = c["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), c["usage"]["completion_tokens"].get<size_t>());
  for (const auto& t : lp) {
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(t["token"], t["top_logprobs"][0]["token"]);
    EXPECT_DOUBLE_EQ(t["logprob"].get<double>(), t["top_logprobs"][0]["logprob"].get<double>());
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["top_logprobs"][1]["logprob"].get<double>());
    EXPECT_TRUE(t["bytes"].is_array());
  }
  post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"top_logprobs":3})", &status);
  EXPECT_EQ(status, 400);
  post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21})",
       &status);
  EXPECT_EQ(status, 400);
}

// A client that goes away mid-stream cancels its generation; a full queue answers 503 at once.
TEST_F(Serve, disconnects_cancel_and_a_full_queue_is_503) {
  start({"--max-queue", "0"});
  std::atomic<bool> first_chunk{false};
  std::thread streamer([&] {
    int chunks = 0;
    post_until_hang_up(R"({"messages":[{"role":"user","content":"go"}],"max_tokens":3500,"temperature":1,"seed":1,
                           "stream":true})",
                       [&](const char*, size_t) {
                         first_chunk = true;
                         return ++chunks < 20;  // then hang up
                       });
  });
  for (int i = 0; i < 200 && !first_chunk; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // While it runs, the queue (0 waiting allowed) is full.
  int status = 0;
  const json busy = post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2})",
                         &status);
  streamer.join();
  if (first_chunk) {
    EXPECT_TRUE(status == 503 || status == 200) << busy.dump();  // 200 only if the stream had already ended
    if (status == 503) {
      EXPECT_TRUE(busy.contains("error"));
    }
  }
  // The hung-up stream was cancelled: the engine is free again well before 3500 tokens.
  expect_cancelled_and_free(50);
  expect_alive();
}

// The Responses API: the same conversation gives the same text as chat; streams are response.* events.
TEST_F(Serve, responses_api_plain_streamed_and_items) {
  start();
  int status = 0;
  const json chat = post("/v1/chat/completions",
                         R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}],
                             "max_tokens":8,"temperature":0})",
                         &status);
  ASSERT_EQ(status, 200);
  const std::string want = chat["choices"][0]["message"]["content"];
  const json r = post("/v1/responses",
                      R"({"instructions":"be brief","input":"hello","max_output_tokens":8,"temperature":0})", &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "response");
  EXPECT_TRUE(r["status"] == "completed" || r["status"] == "incomplete");
  ASSERT_EQ(r["output"][0]["type"], "message");
  EXPECT_EQ(r["output"][0]["content"][0]["type"], "output_text");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], want);
  EXPECT_EQ(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  // The same prompt as the chat request's: restored whole from the prefix cache.
  EXPECT_EQ(r["usage"]["input_tokens_details"]["cached_tokens"], r["usage"]["input_tokens"]);
  EXPECT_EQ(r["instructions"], "be brief");

  auto s = client_->Post("/v1/responses",
                         R"({"instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text",
                             "text":"hello"}]}],"max_output_tokens":8,"temperature":0,"stream":true})",
                         "application/json");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200);
  std::vector<std::string> types;
  std::string text;
  size_t pos = 0;
  while ((pos = s->body.find("event: ", pos)) != std::string::npos) {
    const size_t nl = s->body.find('\n', pos);
    const std::string type = s->body.substr(pos + 7, nl - pos - 7);
    const size_t data = s->body.find("data: ", nl);
    const size_t end = s->body.find("\n\n", data);
    const json ev = json::parse(s->body.substr(data + 6, end - data - 6));
    EXPECT_EQ(ev["type"], type);
    EXPECT_EQ(ev["sequence_number"].get<size_t>(), types.size());
    types.push_back(type);
    if (type == "response.output_text.delta") text += ev["delta"].get<std::string>();
    pos = end;
  }
  ASSERT_GE(types.size(), 3u);
  EXPECT_EQ(types.front(), "response.created");
  EXPECT_TRUE(types.back() == "response.completed" || types.back() == "response.incomplete") << types.back();
  EXPECT_EQ(s->body.find("[DONE]"), std::string::npos);
  EXPECT_EQ(text, want);

  // Function call items and their outputs are part of the conversation.
  post("/v1/responses",
       R"({"input":[{"role":"user","content":"weather?"},
                    {"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
                    {"type":"function_call_output","call_id":"c1","output":"sunny"}],
           "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],
           "max_output_tokens":4})",
       &status);
  EXPECT_EQ(status, 200);
  for (const char* bad : {R"({"input":"x","previous_response_id":"resp_1"})", R"({"instructions":"x"})",
                          R"({"input":"x","max_output_tokens":-1})", R"({"input":[{"type":"image"}]})"}) {
    const json e = post("/v1/responses", bad, &status);
    EXPECT_EQ(status, 400) << bad;
    EXPECT_TRUE(e.contains("error")) << bad;
  }
  expect_alive();
}

// With a Qwen3.5 template (XML tool calls), a named tool_choice opens the call in that form.
TEST_F(Serve, named_tool_choice_uses_the_templates_call_syntax) {
  namespace fs = std::filesystem;
  const std::string dir = scratch() + "/qwen35-template";
  fs::create_directories(dir);
  const std::string src = test::fixture_path("models/tiny-qwen3");
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"})
    fs::copy_file(src + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  std::ifstream tin(test::fixture_path("templates/qwen3.5.jinja"));
  const std::string tmpl((std::istreambuf_iterator<char>(tin)), std::istreambuf_iterator<char>());
  std::ifstream cin(src + "/tokenizer_config.json");
  json cfg = json::parse(cin);
  cfg["chat_template"] = tmpl;
  std::ofstream(dir + "/tokenizer_config.json") << cfg.dump();
  model_ = dir;
  start();
  int status = 0;
  const json c = post("/v1/chat/completions",
                      R"({"messages":[{"role":"user","content":"weather?"}],"max_tokens":3,"temperature":0,
                          "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],
                          "tool_choice":{"type":"function","function":{"name":"get_weather"}}})",
                      &status);
  ASSERT_EQ(status, 200) << c.dump();
  const json& msg = c["choices"][0]["message"];
  if (!msg.contains("tool_calls"))
    EXPECT_EQ(msg["content"].get<std::string>().rfind("<tool_call>\n<function=get_weather>", 0), 0u) << msg.dump();
}

// Greedy output over HTTP equals `dflash run` on the same prompt (same template arguments).
TEST_F(Serve, greedy_output_equals_dflash_run) {
  start();
  int status = 0;
  const json c = post("/v1/chat/completions",
                      R"({"messages":[{"role":"user","content":"hello there"}],"max_tokens":12,"temperature":0,
                          "chat_template_kwargs":{"enable_thinking":false}})",
                      &status);
  ASSERT_EQ(status, 200) << c.dump();
  const auto r = test::run_command(std::string(DFLASH_BIN) + " run --model " +
                                   test::shell_quote(test::fixture_path("models/tiny-qwen3")) +
                                   " --chat -p 'hello there' -n 12 --temperature 0 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string out = r.out;
  if (!out.empty() && out.back() == '\n') out.pop_back();  // run ends its output with a newline
  EXPECT_EQ(c["choices"][0]["message"]["content"].get<std::string>(), out);
}

// A corpus of malformed requests (every field of a valid request given bad values, broken bodies, other
// routes): each gets its 4xx and an OpenAI error body, and the server stays up.
TEST_F(Serve, a_hundred_malformed_requests) {
  start({"--ctx", "512", "--max-body", "65536"});
  struct Bad {
    std::string path, body;
    int status;
  };
  std::vector<Bad> corpus;
  const json valid = {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 4}};
  const std::vector<std::pair<std::string, std::vector<json>>> fields = {
      {"messages", {nullptr, json::array(), "hi", 5, json::array({1}), json::array({{{"role", 1}}}),
                    json::array({{{"role", "robot"}, {"content", "x"}}}), json::array({{{"content", "x"}}}),
                    json::array({{{"role", "user"}, {"content", 7}}}),
                    json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})}},
      {"max_tokens", {-1, 0, "ten", 1.5, 100000, true}},
      {"max_completion_tokens", {-3, "x", 1e12}},
      {"temperature", {-0.1, 2.5, "warm", json::array()}},
      {"top_p", {0, -1, 1.5, "x"}},
      {"top_k", {-1, "x", 2.5}},
      {"min_p", {-0.5, 2, "x"}},
      {"presence_penalty", {3, -3, "x"}},
      {"frequency_penalty", {3, -3, "x"}},
      {"seed", {"x", 1.5, json::object()}},
      {"stop", {5, json::array({1}), json::array({"a", "b", "c", "d", "e"}), json::object()}},
      {"n", {0, 2, "1"}},
      {"stream", {"yes", 1, json::object()}},
      {"stream_options", {"x", json{{"include_usage", "yes"}}}},
      {"tools", {json::object(), json::array({1}), json::array({{{"type", "retrieval"}}}),
                 json::array({{{"type", "function"}, {"function", {{"name", 3}}}}})}},
      {"tool_choice", {"sometimes", 3, json{{"type", "function"}}}},
      {"logprobs", {"yes", 3}},
      {"top_logprobs", {-1, 21, "x"}},
      {"response_format", {json{{"type", "json_schema"}}, "json"}},
      {"chat_template_kwargs", {json::array(), "x"}},
      {"reasoning_effort", {"extreme", 3}},
      {"model", {3, json::array()}},
  };
  for (const auto& [field, values] : fields)
    for (const json& v : values) {
      json b = valid;
      b[field] = v;
      if (field == "top_logprobs") b["logprobs"] = true;
      corpus.push_back({"/v1/chat/completions", b.dump(), 400});
    }
  for (const char* body : {"", "{", "[]", "null", "42", "\"text\"", "{\"messages\": [}", "{'messages': []}"})
    for (const char* path : {"/v1/chat/completions", "/v1/completions", "/v1/responses"})
      corpus.push_back({path, body, 400});
  for (const char* body : {R"({"prompt":5})", R"({"prompt":[]})", R"({"prompt":[1.5]})", R"({})",
                           R"({"prompt":"x","max_tokens":-1})", R"({"prompt":"x","echo":true})",
                           R"({"prompt":"x","best_of":3})", R"({"prompt":"x","logprobs":2})",
                           R"({"prompt":[999999999999]})"})
    corpus.push_back({"/v1/completions", body, 400});
  for (const char* body : {R"({"input":5})", R"({"instructions":"x"})", R"({"input":[{"type":"image"}]})",
                           R"({"input":"x","previous_response_id":"r"})", R"({"input":"x","max_output_tokens":0})",
                           R"({"input":[{"type":"function_call"}]})", R"({"input":"x","tools":[{"type":"web_search"}]})",
                           R"({"input":"x","text":{"format":{"type":"json_schema"}}})"})
    corpus.push_back({"/v1/responses", body, 400});
  for (const char* body : {R"({})", R"({"content":5})", R"({"tokens":"x"})", R"({"tokens":[-1]})"}) {
    corpus.push_back({"/tokenize", body, 400});
    corpus.push_back({"/detokenize", body, 400});
  }
  corpus.push_back({"/v1/nothing", "{}", 404});
  corpus.push_back({"/v1/chat/completions", std::string(70000, ' '), 413});
  std::string long_prompt;
  for (int i = 0; i < 700; ++i) long_prompt += "word ";
  corpus.push_back({"/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", long_prompt}}}}}.dump(), 400});
  ASSERT_GE(corpus.size(), 100u);
  int checked = 0;
  for (const Bad& b : corpus) {
    int status = 0;
    const json e = post(b.path, b.body, &status);
    EXPECT_EQ(status, b.status) << b.path << " " << b.body.substr(0, 200);
    EXPECT_TRUE(e.is_object() && e.contains("error") && e["error"].contains("message"))
        << b.path << " " << b.body.substr(0, 200) << " -> " << e.dump();
    if (++checked % 20 == 0) expect_alive();
  }
  expect_alive();
  std::printf("malformed corpus: %d requests\n", checked);
}

// 32 streaming clients at once, every fourth hanging up midway: all finish or are cancelled, the
// engine serves them one at a time in turn, and the server's memory stays level over rounds.
TEST_F(Serve, thirty_two_concurrent_streams_with_disconnects) {
  start({"--max-queue", "64"});
  auto rss_kb = [&]() {
    std::ifstream st("/proc/" + std::to_string(proc_->pid()) + "/status");
    std::string line;
    while (std::getline(st, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return 0L;
  };
  long first_round_rss = 0;
  for (int round = 0; round < 3; ++round) {
    std::atomic<int> done{0}, hung_up{0}, failed{0};
    std::vector<std::thread> clients;
    for (int c = 0; c < 32; ++c)
      clients.emplace_back([&, c] {
        httplib::Client cl("127.0.0.1", port_);
        cl.set_read_timeout(120, 0);
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/chat/completions";
        req.body = json{{"messages", {{{"role", "user"}, {"content", "client " + std::to_string(c)}}}},
                        {"max_tokens", 48},
                        {"stream", true},
                        {"seed", c}}
                       .dump();
        req.set_header("Content-Type", "application/json");
        std::string body;
        const bool hang_up = c % 4 == 3;
        int reads = 0;
        req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
          body.append(d, n);
          return !(hang_up && ++reads >= 2);
        };
        auto res = cl.send(req);
        if (hang_up) {
          ++hung_up;
        } else if (res && res->status == 200 && body.find("data: [DONE]") != std::string::npos) {
          ++done;
        } else {
          ++failed;
          std::fprintf(stderr, "client %d: %s status %d body %.200s\n", c, res ? "response" : httplib::to_string(res.error()).c_str(),
                       res ? res->status : -1, body.c_str());
        }
      });
    for (auto& t : clients) t.join();
    EXPECT_EQ(done.load(), 24) << "round " << round;
    EXPECT_EQ(failed.load(), 0) << "round " << round;
    expect_alive();
    const long rss = rss_kb();
    if (round == 0) first_round_rss = rss;
    else EXPECT_LT(rss, first_round_rss + 20 * 1024) << "round " << round << ": RSS grew from " << first_round_rss;
  }
}

// With --parallel 2, a short stream that arrives while a long one runs is served next to it, a token of
// each in turn: its text arrives, and it ends, while the long stream is still going. With both slots busy
// and no waiting allowed (--max-queue 0) a third request gets 503. /props and /metrics report the slots.
TEST_F(Serve, parallel_slots_interleave_a_short_stream_with_a_long_one) {
  start({"--parallel", "2", "--max-queue", "0"});
  auto props = client_->Get("/props");
  ASSERT_TRUE(props);
  EXPECT_EQ(json::parse(props->body)["total_slots"], 2);
  // A stream of /v1/completions (every data event but [DONE] carries text); flags as its events arrive.
  struct Stream {
    std::atomic<bool> text{false}, done{false}, hang_up{false};
    std::string body;
  };
  auto run_stream = [this](Stream& st, const std::string& prompt, int max_tokens) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", true}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&st](const char* d, size_t n, uint64_t, uint64_t) {
      st.body.append(d, n);
      if (st.body.find("data: {") != std::string::npos) st.text = true;
      if (st.body.find("data: [DONE]") != std::string::npos) st.done = true;
      return !st.hang_up.load();
    };
    c.send(req);
  };
  auto wait_for = [](const std::atomic<bool>& flag) {
    for (int i = 0; i < 3000 && !flag; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return flag.load();
  };
  // Greedy on this model runs to max_tokens (no end-of-generation token): 3000 tokens take seconds.
  Stream a, b, c;
  std::thread ta([&] { run_stream(a, "go", 3000); });
  ASSERT_TRUE(wait_for(a.text));
  bool b_text_while_a_runs = false;
  std::thread tb([&] {
    run_stream(b, "hello there", 8);
    b_text_while_a_runs = b.text && !a.done;
  });
  tb.join();
  EXPECT_TRUE(b.done) << b.body;
  EXPECT_TRUE(b_text_while_a_runs) << "the short stream waited for the long one";
  EXPECT_FALSE(a.done) << "the long stream ended before the short one";
  // Both slots busy (a second long stream), none may wait: 503.
  std::thread tc([&] { run_stream(c, "The capital of", 3000); });
  ASSERT_TRUE(wait_for(c.text));
  auto m = client_->Get("/metrics");
  ASSERT_TRUE(m);
  int status = 0;
  const json busy = post("/v1/completions", R"({"prompt":"x","max_tokens":2})", &status);
  if (!a.done && !c.done) {  // (a 3000-token stream ending by now would be a surprise, not a failure)
    EXPECT_EQ(status, 503) << busy.dump();
    EXPECT_NE(m->body.find("dflash_slots_busy 2"), std::string::npos) << m->body;
  }
  EXPECT_NE(m->body.find("dflash_slots_total 2"), std::string::npos) << m->body;
  // Hanging up frees the slots.
  a.hang_up = true;
  c.hang_up = true;
  ta.join();
  tc.join();
  for (int i = 0; i < 100; ++i) {
    post("/v1/completions", R"({"prompt":"x","max_tokens":2})", &status);
    if (status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status, 200);
  expect_alive();
}

TEST(ServeFlags, parallel_outside_1_to_64_is_refused_before_listening) {
  for (const char* n : {"0", "65", "-2"}) {
    const auto r = test::run_command(std::string(DFLASH_BIN) + " serve " +
                                     test::shell_quote(test::fixture_path("models/tiny-qwen3")) +
                                     " --port 0 --parallel " + n);
    EXPECT_NE(r.exit_code, 0) << n;
    EXPECT_NE((r.out + r.err).find("--parallel must be 1..64"), std::string::npos) << n << ": " << r.out << r.err;
  }
}

TEST_F(Serve, malformed_requests_get_openai_errors_and_the_server_stays_up) {
  start({"--ctx", "256"});
  const std::pair<const char*, int> cases[] = {
      {"not json", 400},
      {R"({"messages":[]})", 400},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-1})", 400},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":100000})", 400},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":-1})", 400},
      {R"({"messages":[{"role":"user","content":"x"}],"n":3})", 400},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400},  // invalid UTF-8
  };
  for (const auto& [body, want] : cases) {
    int status = 0;
    const json e = post("/v1/chat/completions", body, &status);
    EXPECT_EQ(status, want) << body;
    EXPECT_TRUE(e.is_object() && e.contains("error") && e["error"].contains("message")) << body << " -> " << e.dump();
    expect_alive();
  }
  // A prompt longer than the context (256 tokens here).
  std::string longtext;
  for (int i = 0; i < 400; ++i) longtext += "word ";
  int status = 0;
  const json e = post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", longtext}}}}}.dump(),
                      &status);
  EXPECT_EQ(status, 400) << e.dump();
  auto nf = client_->Get("/v2/nothing");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_TRUE(json::parse(nf->body, nullptr, false).contains("error"));
  expect_alive();
}

TEST_F(Serve, api_key_guards_everything_but_health) {
  start({"--api-key", "s3cret"});
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  EXPECT_EQ(json::parse(models->body)["error"]["type"], "authentication_error");
  int status = 0;
  post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2})", &status);
  EXPECT_EQ(status, 401);
  post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2})", &status,
       {{"Authorization", "Bearer s3cret"}});
  EXPECT_EQ(status, 200);
  post("/cache/clear", "{}", &status);
  EXPECT_EQ(status, 401);
  const json cleared = post("/cache/clear", "{}", &status, {{"Authorization", "Bearer s3cret"}});
  EXPECT_EQ(status, 200);
  EXPECT_TRUE(cleared["cleared"].is_number_integer()) << cleared.dump();
  expect_alive();
}

// The official OpenAI SDK (npm `openai`) as the client: models, a completion, a stream with usage, and an
// error surfacing as its APIError with our status and type.
TEST_F(Serve, the_openai_sdk_talks_to_it) {
  if (test::oracle_path("openai/package.json").empty()) DF_SKIP_LOUDLY("npm package openai is not installed");
  if (test::run_command("node --version").exit_code != 0) DF_SKIP_LOUDLY("node is not installed");
  start({"--api-key", "k-123"});
  const auto r = test::run_command("node " + test::shell_quote(test::source_dir() + "/tests/oracle/openai_chat.mjs") +
                                   " http://127.0.0.1:" + std::to_string(port_) + "/v1 k-123");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json out = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.out;
  EXPECT_EQ(out["models"], json::array({"tiny-qwen3"}));
  EXPECT_EQ(out["plain"]["role"], "assistant");
  EXPECT_EQ(out["stream"]["content"], out["plain"]["content"]);
  EXPECT_EQ(out["stream"]["finish_reason"], out["plain"]["finish_reason"]);
  // The streamed request repeats the plain one: its whole prompt comes from the prefix cache.
  EXPECT_EQ(out["plain"]["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(out["stream"]["usage"]["prompt_tokens_details"]["cached_tokens"], out["plain"]["usage"]["prompt_tokens"]);
  json stream_usage = out["stream"]["usage"];
  stream_usage["prompt_tokens_details"]["cached_tokens"] = 0;
  EXPECT_EQ(stream_usage, out["plain"]["usage"]);
  EXPECT_GE(out["stream"]["chunks"].get<int>(), 3);
  EXPECT_EQ(out["error"]["status"], 400);
  EXPECT_EQ(out["error"]["type"], "invalid_request_error");
  // Tools, auto and forced: an assistant message either way (this random model writes no valid call; a
  // forced one comes back as the call's text).
  for (const char* k : {"auto", "required", "named"}) {
    EXPECT_EQ(out["tools"][k]["role"], "assistant") << k;
  }
  EXPECT_EQ(out["tools"]["required"]["content"].get<std::string>().rfind("<tool_call>", 0), 0u)
      << out["tools"].dump();
  EXPECT_EQ(out["tools"]["named"]["content"].get<std::string>().rfind("<tool_call>\n{\"name\": \"get_weather\"", 0),
            0u)
      << out["tools"].dump();
  EXPECT_TRUE(out["completion"]["text"].is_string());
  EXPECT_GT(out["completion"]["usage"]["prompt_tokens"].get<int>(), 0);
  // The Responses API through the SDK: the same text as chat (same conversation, greedy).
  EXPECT_EQ(out["responses"]["output_text"], out["plain"]["content"]);
  EXPECT_EQ(out["responses_stream"]["text"], out["plain"]["content"]);
  EXPECT_TRUE(out["responses_stream"]["last"] == "response.completed" ||
              out["responses_stream"]["last"] == "response.incomplete");
  expect_alive();
}

// A plain (not streamed) request still running after a second goes out as chunked JSON led by one space
// a second: a client that hangs up makes a write fail, which cancels the request and frees its slot.
TEST_F(Serve, a_plain_request_whose_client_hangs_up_is_cancelled) {
  bundled_ = true;  // slow enough on the CPU (~7 ms a token) that 3500 tokens take far longer than the test
  start({"--max-queue", "0"});
  std::atomic<bool> got{false};
  post_until_hang_up(R"({"messages":[{"role":"user","content":"go"}],"max_tokens":3500,"temperature":1,"seed":1,
                         "logit_bias":{"0":-100,"1":-100,"2":-100}})",
                     [&](const char* data, size_t n) {
                       got = n > 0 && data[0] == ' ';
                       return false;  // hang up at the first keepalive byte
                     });
  EXPECT_TRUE(got) << "a long plain request should send keepalive spaces";
  // The hung-up request was cancelled: the engine is free again well before 3500 tokens.
  expect_cancelled_and_free(100);
  // A long plain request that completes (600 tokens: seconds on the CPU, far past the first keepalive
  // second): spaces, then the completion, which parses as JSON.
  auto r = client_->Post("/v1/chat/completions",
                         R"({"messages":[{"role":"user","content":"go"}],"max_tokens":600,"temperature":1,"seed":2,
                             "logit_bias":{"0":-100,"1":-100,"2":-100}})",
                         "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  const json done = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(done.is_object()) << r->body.substr(0, 200);
  EXPECT_EQ(done["object"], "chat.completion");
  EXPECT_EQ(r->body[0], ' ');
  expect_alive();
}

// The bundled default model: `dflash serve` (and `run`) with no model argument use it, and it answers a
// request like those it was trained on with the function asked for (greedy: the reply is fixed).
TEST_F(Serve, no_model_argument_serves_the_bundled_default_model) {
  bundled_ = true;
  start();
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "default-coder-19m-q8_0.gguf");
  const std::string ask = "Write a Python function `add(a, b)` that returns the sum of a and b.";
  int status = 0;
  const json off = post("/v1/chat/completions",
                        json{{"messages", {{{"role", "user"}, {"content", ask}}}}, {"max_tokens", 24},
                             {"temperature", 0}, {"chat_template_kwargs", {{"enable_thinking", false}}}}
                            .dump(),
                        &status);
  ASSERT_EQ(status, 200) << off.dump();
  const std::string code = off["choices"][0]["message"]["content"];
  EXPECT_EQ(code.rfind("```python\ndef add(a, b):", 0), 0u) << code;
  // Thinking on (the template's default): a sentence of reasoning, then the same kind of reply.
  const json on = post("/v1/chat/completions",
                       json{{"messages", {{{"role", "user"}, {"content", ask}}}}, {"max_tokens", 60},
                            {"temperature", 0}}.dump(),
                       &status);
  ASSERT_EQ(status, 200) << on.dump();
  const json& msg = on["choices"][0]["message"];
  ASSERT_TRUE(msg.contains("reasoning_content")) << on.dump();
  EXPECT_NE(msg["reasoning_content"].get<std::string>().find("add"), std::string::npos) << on.dump();
  EXPECT_NE(msg["content"].get<std::string>().find("def add("), std::string::npos) << on.dump();

  const auto r = test::run_command(std::string(DFLASH_BIN) + " run --chat -p " + test::shell_quote(ask) +
                                   " -n 24 --temperature 0 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string out = r.out;
  if (!out.empty() && out.back() == '\n') out.pop_back();
  EXPECT_EQ(out, code);
  EXPECT_NE(r.err.find("bundled default model"), std::string::npos) << r.err;
}

// response_format json_object: whatever the model would have said, the reply is one JSON object (or, cut
// by max_tokens, a prefix of one), plain, streamed and sampled alike; with tools it is refused.
TEST_F(Serve, json_object_replies_are_json_objects) {
  bundled_ = true;
  start();
  int complete = 0;
  const std::vector<std::string> asks = {
      "Return a JSON object with keys name and age for a person called Ann who is 31.",
      "Give me a JSON object describing the function add(a, b).", "Hello! Who are you?"};
  for (const auto& ask : asks) {
    for (int seed = -1; seed < 3; ++seed) {  // -1: greedy
      json body = {{"messages", {{{"role", "user"}, {"content", ask}}}},
                   {"max_tokens", 160},
                   {"response_format", {{"type", "json_object"}}},
                   {"temperature", seed < 0 ? 0.0 : 1.0}};
      if (seed >= 0) body["seed"] = seed;
      int status = 0;
      const json c = post("/v1/chat/completions", body.dump(), &status);
      ASSERT_EQ(status, 200) << c.dump();
      const std::string text = c["choices"][0]["message"]["content"];
      EXPECT_FALSE(c["choices"][0]["message"].contains("reasoning_content")) << c.dump();
      if (c["choices"][0]["finish_reason"] == "stop") {
        const json parsed = json::parse(text, nullptr, false);
        EXPECT_TRUE(parsed.is_object()) << ask << " seed " << seed << ": " << text;
        ++complete;
      } else {
        JsonObjectPrefix prefix;
        EXPECT_EQ(prefix.push(text), text.size()) << ask << " seed " << seed << ": " << text;
      }
      if (seed < 0) {  // streamed: the same text
        body["stream"] = true;
        auto r = client_->Post("/v1/chat/completions", body.dump(), "application/json");
        ASSERT_TRUE(r);
        std::string streamed;
        for (size_t pos = 0; (pos = r->body.find("data: {", pos)) != std::string::npos; ++pos) {
          const json chunk = json::parse(r->body.substr(pos + 6, r->body.find("\n\n", pos) - pos - 6));
          const json& d = chunk["choices"][0]["delta"];
          if (d.contains("content")) streamed += d["content"].get<std::string>();
        }
        EXPECT_EQ(streamed, text);
      }
    }
  }
  EXPECT_GE(complete, 3) << "too few replies closed their object within max_tokens";
  int status = 0;
  const json tools = post("/v1/chat/completions",
                          R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},
                              "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]})",
                          &status);
  EXPECT_EQ(status, 400) << tools.dump();
  EXPECT_EQ(tools["error"]["param"], "response_format") << tools.dump();
  expect_alive();
}

// A three-turn chat (each turn: the history, the model's previous reply, a new user message), with the
// prefix cache on and off. With it on, turn 1 restores nothing, turn 2 restores the prompt up to the end of
// turn 1's user message and turn 3 up to the end of turn 2's (positions found with /apply-template and
// /tokenize); the replies are the same bit for bit as with the cache off. /props, /metrics and the log
// show the hits; POST /cache/clear empties it, the next request misses, and the one after restores all of
// its prompt. On the Qwen3 fixture and on the Qwen3.5 one (DeltaNet state in the snapshots).
class ServePrefixCache : public Serve, public ::testing::WithParamInterface<std::string> {
 protected:
  struct Turn {
    std::string reply;
    int64_t prompt_tokens = 0, cached_tokens = 0;
  };
  json request_of(const json& messages) {
    return json{{"messages", messages},
                {"max_tokens", 8},
                {"temperature", 0},
                {"chat_template_kwargs", {{"enable_thinking", false}}}};
  }
  Turn turn(const json& messages) {
    int status = 0;
    const json c = post("/v1/chat/completions", request_of(messages).dump(), &status);
    EXPECT_EQ(status, 200) << c.dump();
    Turn t;
    if (status != 200) return t;
    t.reply = c["choices"][0]["message"]["content"].is_string() ? c["choices"][0]["message"]["content"].get<std::string>()
                                                               : std::string();
    t.prompt_tokens = c["usage"]["prompt_tokens"].get<int64_t>();
    t.cached_tokens = c["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    EXPECT_EQ(c["timings"]["cache_n"].get<int64_t>(), t.cached_tokens);
    EXPECT_EQ(c["timings"]["prompt_n"].get<int64_t>(), t.prompt_tokens - t.cached_tokens);
    return t;
  }
  // The ids of the prompt `messages` render to.
  std::vector<int32_t> prompt_ids(const json& messages) {
    int status = 0;
    const json rendered = post("/apply-template", request_of(messages).dump(), &status);
    EXPECT_EQ(status, 200) << rendered.dump();
    const json ids = post("/tokenize", json{{"content", rendered["prompt"]}, {"add_special", true}}.dump(), &status);
    EXPECT_EQ(status, 200) << ids.dump();
    return ids["tokens"].get<std::vector<int32_t>>();
  }
  // Where the last complete turn of a rendered prompt ends: after its last <|im_end|> and the newline.
  int64_t end_of_last_turn(const std::vector<int32_t>& ids) {
    int status = 0;
    const int32_t im_end = post("/tokenize", R"({"content":"<|im_end|>","add_special":true})", &status)["tokens"][0];
    const int32_t nl = post("/tokenize", R"({"content":"\n"})", &status)["tokens"][0];
    for (auto i = static_cast<int64_t>(ids.size()) - 1; i >= 0; --i)
      if (ids[static_cast<size_t>(i)] == im_end)
        return i + 1 + (i + 1 < static_cast<int64_t>(ids.size()) && ids[static_cast<size_t>(i + 1)] == nl ? 1 : 0);
    return 0;
  }
  double metric(const std::string& name) {
    auto m = client_->Get("/metrics");
    if (!m) return -1;
    const size_t at = m->body.find("\n" + name + " ");
    if (at == std::string::npos) return -1;
    return std::stod(m->body.substr(at + name.size() + 2));
  }
};

TEST_P(ServePrefixCache, multi_turn_chat_restores_earlier_turns_and_replies_the_same) {
  model_ = test::fixture_path("models/" + GetParam());
  const json system = {{"role", "system"},
                       {"content", "You are a careful assistant. You answer in short sentences, you cite the "
                                   "documents you were given, and you never invent facts."}};
  const json user1 = {{"role", "user"},
                      {"content", "Please decode this JSON document for me and tell me which keys it has: "
                                  "{\"name\": \"decoder\", \"version\": 3}"}};
  const json user2 = {{"role", "user"},
                      {"content", "Now explain what a scanner does when it meets a backslash inside a string, "
                                  "and why the decoder keeps a memo of keys."}};
  const json user3 = {{"role", "user"},
                      {"content", "Finally, show how an object hook changes the value that loads returns for "
                                  "the same document."}};
  auto converse = [&](std::vector<Turn>* turns, std::vector<json>* prompts) {
    json msgs = json::array({system, user1});
    for (const json& next : {user2, user3, json()}) {
      prompts->push_back(msgs);
      turns->push_back(turn(msgs));
      if (next.is_null()) break;
      msgs.push_back({{"role", "assistant"}, {"content", turns->back().reply}});
      msgs.push_back(next);
    }
  };

  // The cache off: every prompt is prefilled whole.
  start({"--prefix-cache-mib", "0"});
  std::vector<Turn> off;
  std::vector<json> prompts;
  converse(&off, &prompts);
  ASSERT_EQ(off.size(), 3u);
  for (const Turn& t : off) EXPECT_EQ(t.cached_tokens, 0);
  auto props = client_->Get("/props");
  ASSERT_TRUE(props);
  EXPECT_EQ(json::parse(props->body)["cache"]["prefix_cache"], false);
  EXPECT_EQ(metric("dflash_prefix_cache_hits_total"), 0);
  // Where turns 2 and 3 may restore from: the end of the previous prompt's last complete turn.
  const int64_t want2 = end_of_last_turn(prompt_ids(prompts[0]));
  const int64_t want3 = end_of_last_turn(prompt_ids(prompts[1]));
  ASSERT_GT(want2, 0);
  ASSERT_GT(want3, want2);
  EXPECT_EQ(static_cast<int64_t>(prompt_ids(prompts[2]).size()), off[2].prompt_tokens);

  // The cache on (the default): the same conversation.
  proc_.reset();
  start();
  std::vector<Turn> on;
  std::vector<json> prompts_on;
  converse(&on, &prompts_on);
  ASSERT_EQ(on.size(), 3u);
  EXPECT_EQ(prompts_on, prompts);
  EXPECT_EQ(on[0].cached_tokens, 0);
  EXPECT_EQ(on[1].cached_tokens, want2);
  EXPECT_EQ(on[2].cached_tokens, want3);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(on[i].reply, off[i].reply) << "turn " << i + 1;
    EXPECT_EQ(on[i].prompt_tokens, off[i].prompt_tokens) << "turn " << i + 1;
  }
  props = client_->Get("/props");
  ASSERT_TRUE(props);
  const json cache = json::parse(props->body)["cache"];
  EXPECT_EQ(cache["prefix_cache"], true);
  EXPECT_EQ(cache["capacity_bytes"], int64_t{1024} << 20);
  EXPECT_GT(cache["used_bytes"].get<int64_t>(), 0);
  EXPECT_GT(cache["entries"].get<int64_t>(), 0);
  EXPECT_EQ(cache["hits"], 2);
  EXPECT_EQ(cache["misses"], 1);
  EXPECT_EQ(metric("dflash_prefix_cache_hits_total"), 2);
  EXPECT_EQ(metric("dflash_prefix_cache_misses_total"), 1);
  EXPECT_EQ(metric("dflash_prompt_cached_tokens_total"), static_cast<double>(want2 + want3));
  EXPECT_EQ(metric("dflash_prefix_cache_bytes"), cache["used_bytes"].get<double>());
  {
    std::ifstream in(log_);
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(log.find("memory_hit=true restore=true pos=" + std::to_string(want2)), std::string::npos) << log;
    EXPECT_NE(log.find("memory_hit=true restore=true pos=" + std::to_string(want3)), std::string::npos) << log;
  }

  // Cleared: turn 3 again misses, then restores its whole prompt (no forward) and still replies the same.
  int status = 0;
  const json cleared = post("/cache/clear", "{}", &status);
  ASSERT_EQ(status, 200) << cleared.dump();
  EXPECT_EQ(cleared["cleared"], cache["entries"]);
  EXPECT_EQ(metric("dflash_prefix_cache_entries"), 0);
  const Turn again = turn(prompts[2]);
  EXPECT_EQ(again.cached_tokens, 0);
  EXPECT_EQ(again.reply, off[2].reply);
  EXPECT_EQ(metric("dflash_prefix_cache_misses_total"), 2);
  const Turn whole = turn(prompts[2]);
  EXPECT_EQ(whole.cached_tokens, whole.prompt_tokens);
  EXPECT_EQ(whole.reply, off[2].reply);
  expect_alive();
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ServePrefixCache, ::testing::Values("tiny-qwen3", "tiny-qwen35"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n;
                         });

// The disk cache (--kv-cache-dir): snapshot files written after responses and restored after a restart,
// with the same greedy replies as no cache at all; damaged files ignored and removed; a killed server's
// leftovers never loaded; two servers on one directory; the budget held.
class ServeDiskCache : public ServePrefixCache {
 protected:
  struct Extra {  // a second server on the same model
    std::unique_ptr<test::ChildProcess> proc;
    std::unique_ptr<httplib::Client> client;
    std::string log;
  };
  std::vector<std::string> disk_flags(std::vector<std::string> more = {}) {
    std::vector<std::string> f = {"--kv-cache-dir", dir(), "--kv-cache-min-tokens", "1"};
    f.insert(f.end(), more.begin(), more.end());
    return f;
  }
  const std::string& dir() {
    if (dir_.empty()) dir_ = scratch() + "/kv";
    return dir_;
  }
  json cache_props(httplib::Client& c) {
    auto r = c.Get("/props");
    if (!r || r->status != 200) return json();
    return json::parse(r->body)["cache"];
  }
  json cache_props() { return cache_props(*client_); }
  // Waits until the writer has written (or dropped) every snapshot the requests so far left.
  void wait_written(httplib::Client& c) {
    for (int i = 0; i < 200; ++i) {
      const json p = cache_props(c);
      if (p.is_object() && p["disk_pending"] == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "the disk cache did not finish writing";
  }
  void wait_written() { wait_written(*client_); }
  // The published snapshot files (name -> bytes); temporaries not included.
  std::map<std::string, std::vector<uint8_t>> files() {
    std::map<std::string, std::vector<uint8_t>> out;
    if (!std::filesystem::exists(dir())) return out;
    for (const auto& e : std::filesystem::directory_iterator(dir())) {
      const std::string n = e.path().filename().string();
      if (!e.is_regular_file() || n.starts_with(".dflash-snapshot-tmp.")) continue;
      std::ifstream in(e.path(), std::ios::binary);
      out[n] = std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
    }
    return out;
  }
  static void write_file(const std::string& path, const std::vector<uint8_t>& b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
  static std::string slurp(const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  // Every published file reads back whole and valid (its header: identity, ids, checksum).
  void expect_all_files_valid() {
    for (const auto& [name, bytes] : files()) {
      auto info = peek_snapshot_bytes(bytes);
      EXPECT_TRUE(info.ok()) << name << ": " << info.status().to_string();
    }
  }
  Extra start_extra(std::vector<std::string> extra, const std::string& log_name) {
    Extra x;
    x.log = scratch() + "/" + log_name;
    std::string why;
    const int port = test::start_listening(
        [&](int p) {
          std::vector<std::string> argv = {DFLASH_BIN, "serve", model_, "--port", std::to_string(p), "--threads", "1"};
          argv.insert(argv.end(), extra.begin(), extra.end());
          return argv;
        },
        x.log, &x.proc, &why);
    if (port <= 0) {
      ADD_FAILURE() << "the second server: " << why;
      return x;
    }
    x.client = std::make_unique<httplib::Client>("127.0.0.1", port);
    x.client->set_read_timeout(60, 0);
    for (int i = 0; i < 300; ++i) {
      auto r = x.client->Get("/health");
      if (r && r->status == 200) return x;
      if (!x.proc->running()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "the second server did not become healthy; see " << x.log;
    return x;
  }
  Turn turn_on(httplib::Client& c, const json& messages) {
    auto r = c.Post("/v1/chat/completions", request_of(messages).dump(), "application/json");
    Turn t;
    EXPECT_TRUE(r && r->status == 200);
    if (!r || r->status != 200) return t;
    const json j = json::parse(r->body);
    t.reply = j["choices"][0]["message"]["content"].is_string() ? j["choices"][0]["message"]["content"].get<std::string>()
                                                                : std::string();
    t.prompt_tokens = j["usage"]["prompt_tokens"].get<int64_t>();
    t.cached_tokens = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    return t;
  }
  static json system_msg(const std::string& topic) {
    return {{"role", "system"},
            {"content", "You are a careful assistant for " + topic +
                            ". You answer in short sentences, you cite the documents you were given, and you "
                            "never invent facts."}};
  }
  static json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }
  std::string dir_;
};

TEST_P(ServeDiskCache, a_restarted_server_restores_from_disk_and_replies_like_no_cache) {
  model_ = test::fixture_path("models/" + GetParam());
  const json sys = system_msg("JSON decoders");
  const json p1 = json::array({sys, user("Please decode this JSON document for me and tell me which keys it has: "
                                         "{\"name\": \"decoder\", \"version\": 3}")});
  // No cache at all: the reference replies.
  start({"--prefix-cache-mib", "0"});
  const Turn off1 = turn(p1);
  json p2 = p1;
  p2.push_back({{"role", "assistant"}, {"content", off1.reply}});
  p2.push_back(user("Now explain what a scanner does when it meets a backslash inside a string."));
  const Turn off2 = turn(p2);
  json p3 = p2;
  p3.push_back({{"role", "assistant"}, {"content", off2.reply}});
  p3.push_back(user("Finally, show how an object hook changes the value that loads returns."));
  const Turn off3 = turn(p3);
  const int64_t want3 = end_of_last_turn(prompt_ids(p2));
  ASSERT_GT(want3, 0);
  EXPECT_EQ(cache_props()["disk_cache"], false);

  // Session 1: memory and disk; the turns are written after their responses.
  proc_.reset();
  start(disk_flags());
  EXPECT_EQ(turn(p1).reply, off1.reply);
  EXPECT_EQ(turn(p2).reply, off2.reply);
  wait_written();
  json c = cache_props();
  EXPECT_EQ(c["disk_cache"], true);
  EXPECT_EQ(c["disk_writable"], true);
  EXPECT_EQ(c["disk_hits"], 0);
  EXPECT_GT(c["disk_writes"].get<int64_t>(), 0);
  const auto written = files();
  EXPECT_EQ(c["disk_entries"].get<size_t>(), written.size());
  uint64_t total = 0;
  for (const auto& [name, bytes] : written) {
    total += bytes.size();
    struct stat st {};
    ASSERT_EQ(::stat((dir() + "/" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << name;
  }
  EXPECT_EQ(c["disk_used_bytes"].get<uint64_t>(), total);
  struct stat dst {};
  ASSERT_EQ(::stat(dir().c_str(), &dst), 0);
  EXPECT_EQ(dst.st_mode & 0777, 0700u);

  // Another configuration (context size) on the same directory: those files are not its own, and stay.
  proc_.reset();
  start(disk_flags({"--ctx", "2048"}));
  EXPECT_EQ(cache_props()["disk_entries"], 0);
  const Turn other = turn(p2);
  EXPECT_EQ(other.cached_tokens, 0);
  EXPECT_EQ(other.reply, off2.reply);
  wait_written();
  for (const auto& [name, bytes] : written) EXPECT_TRUE(std::filesystem::exists(dir() + "/" + name)) << name;

  // Session 2, as session 1: the directory is scanned at start; turn 2 again restores its whole prompt
  // from disk, turn 3 the end of turn 2's last complete turn; the replies are those of no cache.
  proc_.reset();
  start(disk_flags());
  c = cache_props();
  EXPECT_EQ(c["disk_entries"].get<size_t>(), written.size());
  const Turn again2 = turn(p2);
  EXPECT_EQ(again2.cached_tokens, again2.prompt_tokens);
  EXPECT_EQ(again2.reply, off2.reply);
  const Turn on3 = turn(p3);
  EXPECT_EQ(on3.cached_tokens, want3);
  EXPECT_EQ(on3.reply, off3.reply);
  wait_written();
  c = cache_props();
  EXPECT_EQ(c["disk_hits"], 2);
  EXPECT_EQ(c["disk_misses"], 0);
  EXPECT_EQ(metric("dflash_disk_cache_hits_total"), 2);
  EXPECT_EQ(metric("dflash_disk_cache_misses_total"), 0);
  EXPECT_EQ(metric("dflash_disk_cache_budget_bytes"), double(int64_t{4096} << 20));
  EXPECT_EQ(metric("dflash_disk_cache_entries"), c["disk_entries"].get<double>());
  EXPECT_EQ(metric("dflash_prompt_cached_tokens_total"), static_cast<double>(again2.prompt_tokens + want3));
  const std::string log = slurp(log_);
  EXPECT_NE(log.find("disk_hit=true restore=true pos=" + std::to_string(again2.prompt_tokens)), std::string::npos) << log;
  EXPECT_NE(log.find("disk_hit=true restore=true pos=" + std::to_string(want3)), std::string::npos) << log;
  // Turn 2 once more comes from memory now.
  EXPECT_EQ(turn(p2).reply, off2.reply);
  EXPECT_NE(slurp(log_).find("memory_hit=true restore=true pos=" + std::to_string(again2.prompt_tokens)),
            std::string::npos);

  // /cache/clear empties memory only; {"disk": true} removes the files too.
  wait_written();
  int status = 0;
  json cleared = post("/cache/clear", "{}", &status);
  ASSERT_EQ(status, 200) << cleared.dump();
  EXPECT_EQ(cleared["disk_cleared"], 0);
  EXPECT_FALSE(files().empty());
  const int64_t on_disk = cache_props()["disk_entries"].get<int64_t>();
  cleared = post("/cache/clear", R"({"disk": true})", &status);
  ASSERT_EQ(status, 200) << cleared.dump();
  EXPECT_EQ(cleared["disk_cleared"], on_disk);
  EXPECT_EQ(cache_props()["disk_entries"], 0);
  EXPECT_EQ(post("/cache/clear", R"({"disk": 1})", &status)["error"]["param"], "disk");
  EXPECT_EQ(status, 400);
  const Turn cold = turn(p2);
  EXPECT_EQ(cold.cached_tokens, 0);
  EXPECT_EQ(cold.reply, off2.reply);
  expect_alive();
}

// Each kind of damage to every file between two runs: the server starts, the request is a miss with the
// reply of no cache, and the damaged files are gone (replaced by whole ones written after the response).
TEST_P(ServeDiskCache, damaged_files_are_ignored_and_removed) {
  model_ = test::fixture_path("models/" + GetParam());
  const json p1 = json::array({system_msg("tokenizers"), user("Which byte pairs does a BPE merge first, and why?")});
  start({"--prefix-cache-mib", "0"});
  const Turn ref = turn(p1);
  proc_.reset();
  start(disk_flags());
  turn(p1);
  wait_written();
  proc_.reset();
  const auto originals = files();
  ASSERT_FALSE(originals.empty());

  auto at = [](const std::vector<uint8_t>& b, const std::string& key) {
    auto it = std::search(b.begin(), b.end(), key.begin(), key.end());
    EXPECT_NE(it, b.end()) << key;
    return static_cast<size_t>(it - b.begin()) + key.size() + 4;  // the value, after its u32 type
  };
  using Damage = std::function<void(std::vector<uint8_t>&)>;
  const std::vector<std::pair<std::string, Damage>> damages = {
      {"magic", [](std::vector<uint8_t>& b) { b[0] ^= 0xff; }},
      {"format version", [&](std::vector<uint8_t>& b) { b[at(b, "dflash.snapshot.format_version")] = 99; }},
      {"model identity", [&](std::vector<uint8_t>& b) { b[at(b, "dflash.snapshot.model_mtime")] ^= 0x01; }},
      {"token id", [&](std::vector<uint8_t>& b) { b[at(b, "dflash.snapshot.tokens") + 4 + 8 + 4 * 5] ^= 0x04; }},
      {"absurd token count", [&](std::vector<uint8_t>& b) { b[at(b, "dflash.snapshot.tokens") + 4 + 7] = 0x7f; }},
      {"n_past", [&](std::vector<uint8_t>& b) { b[at(b, "dflash.snapshot.n_past")] ^= 0x02; }},
      {"header checksum", [&](std::vector<uint8_t>& b) { b[at(b, "dflash.snapshot.header_checksum") + 3] ^= 0x10; }},
      {"tensor checksum", [&](std::vector<uint8_t>& b) { b[at(b, "dflash.snapshot.tensor_checksums") + 4 + 8] ^= 0x01; }},
      {"absurd tensor shape", [](std::vector<uint8_t>& b) {
         // The first tensor's name ("kv_k.<layer>", after its u64 length), its u32 dimension count, its dims.
         const std::string key = "kv_k.";
         const auto pos = static_cast<size_t>(std::search(b.begin(), b.end(), key.begin(), key.end()) - b.begin());
         ASSERT_LT(pos, b.size());
         uint64_t len = 0;
         std::memcpy(&len, &b[pos - 8], 8);
         b[pos + len + 4 + 7] = 0x40;
       }},
      {"tensor data", [](std::vector<uint8_t>& b) { b[b.size() - 100] ^= 0x55; }},
      {"truncated to 10 bytes", [](std::vector<uint8_t>& b) { b.resize(10); }},
      {"truncated at a third", [](std::vector<uint8_t>& b) { b.resize(b.size() / 3); }},
      {"truncated at a half", [](std::vector<uint8_t>& b) { b.resize(b.size() / 2); }},
      {"one byte short", [](std::vector<uint8_t>& b) { b.pop_back(); }},
      {"empty", [](std::vector<uint8_t>& b) { b.clear(); }},
  };
  for (const auto& [what, damage] : damages) {
    SCOPED_TRACE(what);
    for (const auto& [name, bytes] : files()) std::filesystem::remove(dir() + "/" + name);
    std::map<std::string, std::vector<uint8_t>> bad;
    for (const auto& [name, bytes] : originals) {
      bad[name] = bytes;
      damage(bad[name]);
      write_file(dir() + "/" + name, bad[name]);
    }
    start(disk_flags());
    const Turn t = turn(p1);
    EXPECT_EQ(t.cached_tokens, 0);
    EXPECT_EQ(t.reply, ref.reply);
    wait_written();
    EXPECT_EQ(cache_props()["disk_removed_bad"].get<size_t>(), originals.size());
    const auto now = files();
    for (const auto& [name, bytes] : bad) {
      auto it = now.find(name);
      if (it != now.end()) {
        EXPECT_NE(it->second, bytes) << name << " was kept";
      }
    }
    expect_all_files_valid();
    EXPECT_NE(slurp(log_).find("disk cache: removing"), std::string::npos);
    proc_.reset();
  }
}

// SIGKILL right after each response, while the writer may be mid-file; and the leftovers of writers killed
// inside the temporary (a partial file under its final name): the next server loads none of it, removes
// the stale leftovers, and replies as before.
TEST_P(ServeDiskCache, a_killed_server_leaves_nothing_that_is_loaded) {
  model_ = test::fixture_path("models/" + GetParam());
  std::vector<json> prompts;
  std::vector<std::string> replies;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(json::array({system_msg("topic " + std::to_string(i)),
                                   user("Tell me three facts about topic " + std::to_string(i) + " and cite them.")}));
    start(disk_flags());
    replies.push_back(turn(prompts.back()).reply);
    ::kill(proc_->pid(), SIGKILL);
    proc_.reset();
  }
  expect_all_files_valid();
  // Once more, killed after its writes (so that there are files to copy below).
  start(disk_flags());
  EXPECT_EQ(turn(prompts[0]).reply, replies[0]);
  wait_written();
  ::kill(proc_->pid(), SIGKILL);
  proc_.reset();
  // Leftovers: a stale one (ten minutes old) and a fresh one (a writer that may still be alive).
  ASSERT_FALSE(files().empty());
  const auto [name, bytes] = *files().begin();
  const std::vector<uint8_t> half(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2));
  const std::string stale = dir() + "/.dflash-snapshot-tmp.Stale1", fresh = dir() + "/.dflash-snapshot-tmp.Fresh1";
  for (const std::string& t : {stale, fresh}) {
    std::filesystem::create_directories(t);
    write_file(t + "/" + name, half);
    write_file(t + "/" + name + ".tmp.1234", half);
  }
  const timespec old[2] = {{std::time(nullptr) - 600, 0}, {std::time(nullptr) - 600, 0}};
  for (const auto& e : std::filesystem::directory_iterator(stale)) ::utimensat(AT_FDCWD, e.path().c_str(), old, 0);
  ::utimensat(AT_FDCWD, stale.c_str(), old, 0);

  start(disk_flags());
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(fresh));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(turn(prompts[i]).reply, replies[i]) << i;
  wait_written();
  expect_all_files_valid();
  EXPECT_EQ(cache_props()["disk_removed_bad"], 0);
  expect_alive();
}

// Two servers of one model on one directory, each answering requests at once: every file stays whole,
// and a prefix one of them wrote is a disk hit for the other.
TEST_P(ServeDiskCache, two_servers_share_a_directory) {
  model_ = test::fixture_path("models/" + GetParam());
  start(disk_flags());
  Extra b = start_extra(disk_flags(), "serve-b.log");
  ASSERT_TRUE(b.client);
  const json p1 = json::array({system_msg("parsers"), user("What does a recursive descent parser do on a left-recursive rule?")});
  const Turn a1 = turn(p1);
  wait_written();
  const Turn b1 = turn_on(*b.client, p1);
  EXPECT_EQ(b1.cached_tokens, b1.prompt_tokens);
  EXPECT_EQ(b1.reply, a1.reply);
  EXPECT_NE(slurp(b.log).find("disk_hit=true"), std::string::npos);

  // Both at once, on the same and on different prompts.
  std::vector<json> prompts;
  for (int i = 0; i < 6; ++i)
    prompts.push_back(json::array({system_msg("shared topic " + std::to_string(i % 3)),
                                   user("Question number " + std::to_string(i) + ": what is a tokenizer for?")}));
  std::vector<std::string> ra(prompts.size()), rb(prompts.size());
  std::thread ta([&] {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    for (size_t i = 0; i < prompts.size(); ++i) ra[i] = turn_on(c, prompts[i]).reply;
  });
  std::thread tb([&] {
    for (size_t i = 0; i < prompts.size(); ++i) rb[prompts.size() - 1 - i] = turn_on(*b.client, prompts[prompts.size() - 1 - i]).reply;
  });
  ta.join();
  tb.join();
  EXPECT_EQ(ra, rb);
  wait_written();
  wait_written(*b.client);
  expect_all_files_valid();
  for (const auto& e : std::filesystem::directory_iterator(dir()))
    EXPECT_FALSE(e.path().filename().string().starts_with(".dflash-snapshot-tmp.")) << e.path();
  // b clears the disk: a's next lookup is a miss (the files are gone), never an error.
  int status = 0;
  auto r = b.client->Post("/cache/clear", R"({"disk": true})", "application/json");
  ASSERT_TRUE(r && r->status == 200);
  post("/cache/clear", "{}", &status);  // a's memory
  const Turn again = turn(p1);
  EXPECT_EQ(again.cached_tokens, 0);
  EXPECT_EQ(again.reply, a1.reply);
  expect_alive();
  EXPECT_TRUE(b.proc->running());
}

// Many distinct prompts with a small budget: the directory never holds more than the budget.
TEST_P(ServeDiskCache, the_budget_holds) {
  model_ = test::fixture_path("models/" + GetParam());
  const double budget_mib = 0.25;
  start(disk_flags({"--kv-cache-budget", "0.25", "--prefix-cache-mib", "0"}));
  const auto budget = static_cast<uint64_t>(budget_mib * (1 << 20));
  EXPECT_EQ(metric("dflash_disk_cache_budget_bytes"), static_cast<double>(budget));
  for (int i = 0; i < 10; ++i) {
    turn(json::array({system_msg("budget topic " + std::to_string(i)),
                      user("Summarize topic " + std::to_string(i) + " in one sentence, with one citation.")}));
    wait_written();
    uint64_t total = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir()))
      if (e.is_regular_file()) total += e.file_size();
    EXPECT_LE(total, budget) << "after prompt " << i;
    EXPECT_LE(cache_props()["disk_used_bytes"].get<uint64_t>(), budget);
  }
  EXPECT_GT(metric("dflash_disk_cache_evictions_total"), 0);
  EXPECT_GT(metric("dflash_disk_cache_writes_total"), 0);
  EXPECT_EQ(metric("dflash_disk_cache_write_errors_total"), 0);
  expect_alive();
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ServeDiskCache, ::testing::Values("tiny-qwen3", "tiny-qwen35"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n;
                         });

TEST_F(Serve, a_taken_port_is_a_clear_error) {
  start();
  test::ChildProcess second({DFLASH_BIN, "serve", test::fixture_path("models/tiny-qwen3"), "--port",
                             std::to_string(port_)},
                            scratch() + "/serve2.log");
  for (int i = 0; i < 100 && second.running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(second.running());
  EXPECT_NE(second.stop(), 0);
  expect_alive();
}

}  // namespace
}  // namespace dflash
