// DFlash speculative decoding through the real binary: `dflash run` and `dflash serve` with a draft give
// the same text as plain decoding (greedy, and sampled with a seed), report their acceptance (the run's
// stderr line; usage, /props and /metrics of the server), honour the residency flags, and refuse bad
// drafts and flags with a clear error. On the bundled trained pair (models/) and the tiny Qwen3.5 fixture
// with its random draft (tests/fixtures/models/tiny-qwen35-dflash).
#include <httplib.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "support/process.h"
#include "unit/cli/serve_process.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

using json = nlohmann::json;
using test::shell_quote;

// A request like those the bundled pair was trained on: its draft accepts some of the reply.
constexpr const char* kAsk = "Write a Python function that checks whether a number is prime.";
constexpr int kTokens = 48;

test::CommandResult dflash(const std::string& args) { return test::run_command(shell_quote(DFLASH_BIN) + " " + args); }

// `dflash run` on the bundled model (no --model), greedy unless `extra` says otherwise.
test::CommandResult run_bundled(const std::string& extra) {
  return dflash("run --chat -p " + shell_quote(kAsk) + " -n " + std::to_string(kTokens) + " --threads 1 " + extra);
}

std::string tiny_target() { return test::fixture_path("models/tiny-qwen35"); }
std::string tiny_draft() { return test::fixture_path("models/tiny-qwen35-dflash"); }

// `dflash run` on the tiny Qwen3.5 fixture.
test::CommandResult run_tiny(const std::string& extra) {
  return dflash("run -m " + shell_quote(tiny_target()) + " -p 'def main():' -n " + std::to_string(kTokens) +
                " --threads 1 " + extra);
}

// run's stderr: "speculative: N steps, drafted D, accepted A, X tokens per step; P plain tokens" and
// "... generated G tokens ...".
struct RunStats {
  bool speculative = false;
  long long steps = 0, drafted = 0, accepted = 0, plain = 0, generated = -1;
  double per_step = 0;
};

RunStats stats_of(const std::string& err) {
  RunStats s;
  if (const size_t at = err.find("generated "); at != std::string::npos)
    std::sscanf(err.c_str() + at, "generated %lld tokens", &s.generated);
  if (const size_t at = err.find("speculative: "); at != std::string::npos)
    s.speculative = std::sscanf(err.c_str() + at,
                                "speculative: %lld steps, drafted %lld, accepted %lld, %lf tokens per step; %lld plain tokens",
                                &s.steps, &s.drafted, &s.accepted, &s.per_step, &s.plain) == 5;
  return s;
}

// What every speculative run's figures must satisfy. Each step emits its accepted drafts and one token of
// its own; every other token (the first, from the prefill's logits, and the adaptive fallback's) is a plain
// one: together they account for every generated token.
void expect_consistent(const RunStats& s, bool adaptive, const std::string& err) {
  ASSERT_TRUE(s.speculative) << err;
  EXPECT_GT(s.steps, 0) << err;
  EXPECT_GE(s.drafted, s.accepted) << err;
  EXPECT_GE(s.accepted, 0) << err;
  EXPECT_NEAR(s.per_step, static_cast<double>(s.accepted + s.steps) / s.steps, 0.006) << err;
  EXPECT_EQ(s.steps + s.accepted + s.plain, s.generated) << err;
  if (!adaptive) {
    EXPECT_LE(s.plain, 2) << err;  // the first token, and the last when no draft fits the budget
  }
}

TEST(SpeculativeRun, bundled_draft_greedy_text_equals_plain_decoding) {
  const auto plain = run_bundled("--temperature 0 --draft none");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_GT(plain.out.size(), 20u);
  EXPECT_FALSE(stats_of(plain.err).speculative) << plain.err;
  EXPECT_EQ(stats_of(plain.err).generated, kTokens) << plain.err;
  for (const std::string mode : {"", "--ddtree", "--no-adaptive-draft", "--ddtree --no-adaptive-draft"}) {
    SCOPED_TRACE(mode.empty() ? "chain (the default draft)" : mode);
    const auto r = run_bundled("--temperature 0 " + mode);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, plain.out);
    EXPECT_NE(r.err.find("default-coder-19m-dflash"), std::string::npos) << r.err;  // the bundled draft was used
    const RunStats s = stats_of(r.err);
    expect_consistent(s, mode.find("no-adaptive") == std::string::npos, r.err);
    EXPECT_GT(s.accepted, 0) << "the trained draft should accept some of a code reply: " << r.err;
  }
}

// Lossless sampling: with a seed, a draft draws the same tokens as plain decoding with that seed.
TEST(SpeculativeRun, bundled_draft_sampling_draws_exactly_like_plain_decoding) {
  std::string first;
  for (const int seed : {1, 7}) {
    const std::string sampling = "--temperature 0.8 --seed " + std::to_string(seed) + " ";
    const auto plain = run_bundled(sampling + "--draft none");
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    for (const std::string mode : {"", "--ddtree"}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " " + mode);
      const auto r = run_bundled(sampling + mode);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.out, plain.out);
      expect_consistent(stats_of(r.err), true, r.err);
    }
    if (first.empty()) {
      first = plain.out;
    } else {
      EXPECT_NE(plain.out, first) << "two seeds drew the same text: the test would not see a sampling mismatch";
    }
  }
}

// The tiny fixture's draft is random: it is rejected nearly everywhere, which exercises the rejection path
// on every step; the text is still exactly that of plain decoding.
TEST(SpeculativeRun, tiny_fixture_draft_text_equals_plain_decoding) {
  const std::string draft = "--draft " + shell_quote(tiny_draft()) + " ";
  for (const std::string sampling : {"--temperature 0", "--temperature 0.9 --seed 5"}) {
    const auto plain = run_tiny(sampling + " --draft none");
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    ASSERT_FALSE(plain.out.empty());
    EXPECT_FALSE(stats_of(plain.err).speculative) << plain.err;
    for (const std::string mode : {"", "--ddtree", "--ddtree --ddtree-budget 3", "--no-adaptive-draft",
                                   "--draft-residency request_scoped"}) {
      SCOPED_TRACE(sampling + " " + mode);
      const auto r = run_tiny(sampling + " " + draft + mode);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.out, plain.out);
      expect_consistent(stats_of(r.err), mode.find("no-adaptive") == std::string::npos, r.err);
    }
  }
}

// The same draft converted to GGUF (arch "dflash", `dflash convert`) drafts exactly as its HF directory does:
// the same text, the same acceptance.
TEST(SpeculativeRun, a_gguf_draft_drafts_like_its_hf_directory) {
  const std::string gguf = test::scratch_dir() + "/tiny-draft.gguf";
  const auto conv = dflash("convert " + shell_quote(tiny_draft()) + " -o " + shell_quote(gguf) + " --type f32");
  ASSERT_EQ(conv.exit_code, 0) << conv.err;
  for (const std::string mode : {"--no-adaptive-draft", "--ddtree --no-adaptive-draft"}) {
    SCOPED_TRACE(mode);
    const auto hf = run_tiny("--temperature 0 --draft " + shell_quote(tiny_draft()) + " " + mode);
    const auto gg = run_tiny("--temperature 0 --draft " + shell_quote(gguf) + " " + mode);
    ASSERT_EQ(hf.exit_code, 0) << hf.err;
    ASSERT_EQ(gg.exit_code, 0) << gg.err;
    EXPECT_EQ(gg.out, hf.out);
    const RunStats a = stats_of(hf.err), b = stats_of(gg.err);
    ASSERT_TRUE(b.speculative) << gg.err;
    EXPECT_EQ(b.steps, a.steps);
    EXPECT_EQ(b.drafted, a.drafted);
    EXPECT_EQ(b.accepted, a.accepted);
  }
}

// A refused run exits 1 with "dflash: <reason>" on stderr and prints no text.
void expect_refused(const test::CommandResult& r, const std::vector<std::string>& says) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("dflash: "), std::string::npos) << r.err;
  for (const auto& s : says) EXPECT_NE(r.err.find(s), std::string::npos) << "want '" << s << "' in: " << r.err;
}

TEST(SpeculativeRun, bad_drafts_and_draft_flags_are_clear_errors) {
  const std::string draft = "--draft " + shell_quote(tiny_draft()) + " ";
  // A model that is not a draft, a path that is not there, drafts made for other targets (layers, width).
  expect_refused(run_tiny("--draft " + shell_quote(test::fixture_path("models/tiny-qwen3"))),
                 {"not a DFlash draft", "qwen3"});
  expect_refused(run_tiny("--draft " + shell_quote(test::scratch_dir() + "/no-such-draft")),
                 {"no-such-draft", "No such file"});
  expect_refused(dflash("run -m " + shell_quote(test::fixture_path("models/tiny-qwen3")) + " -p hi -n 4 " + draft),
                 {"8-layer target", "4 layers"});
  expect_refused(run_tiny("--draft " + shell_quote(test::source_dir() + "/models/default-coder-19m-dflash")),
                 {"hidden size 384", "target's 64"});
  // Flags.
  expect_refused(run_tiny(draft + "--ddtree --ddtree-budget 0"), {"--ddtree-budget", "1..1024"});
  expect_refused(run_tiny(draft + "--draft-residency bogus"), {"bogus", "request-scoped"});
  expect_refused(run_tiny(draft + "--lazy-draft --draft-residency persistent"), {"--lazy-draft", "persistent"});
  expect_refused(run_tiny(draft + "--draft-device cuda:7"), {"cuda:7", "unsupported"});
}

// A damaged copy of the fixture draft: a clear "corrupt" error naming the file, never a crash.
TEST(SpeculativeRun, corrupt_drafts_are_clear_errors) {
  namespace fs = std::filesystem;
  const std::string dir = test::scratch_dir();
  auto copy = [&](const std::string& name) {
    const std::string d = dir + "/" + name;
    fs::copy(tiny_draft(), d, fs::copy_options::recursive);
    return d;
  };
  auto with_config = [&](const std::string& name, auto edit) {
    const std::string d = copy(name);
    json c = json::parse(*read_text_file(d + "/config.json"));
    edit(c);
    std::ofstream(d + "/config.json", std::ios::trunc) << c.dump();
    return d;
  };

  const std::string truncated = copy("truncated");
  fs::resize_file(truncated + "/model.safetensors", fs::file_size(truncated + "/model.safetensors") * 3 / 10);
  expect_refused(run_tiny("--draft " + shell_quote(truncated)), {"corrupt", "model.safetensors", "data section"});

  const std::string empty = copy("empty");
  fs::resize_file(empty + "/model.safetensors", 0);
  expect_refused(run_tiny("--draft " + shell_quote(empty)), {"corrupt", "model.safetensors"});

  const std::string not_json = copy("not-json");
  std::ofstream(not_json + "/config.json", std::ios::trunc) << "{\"architectures\": [\"DFlashDraftModel\"], ";
  expect_refused(run_tiny("--draft " + shell_quote(not_json)), {"corrupt", "config.json", "invalid JSON"});

  const std::string no_weights = copy("no-weights");
  fs::remove(no_weights + "/model.safetensors");
  expect_refused(run_tiny("--draft " + shell_quote(no_weights)), {"model.safetensors"});

  // A config that disagrees with the weights, or names a target layer the target does not have.
  expect_refused(run_tiny("--draft " + shell_quote(with_config("narrow", [](json& c) { c["hidden_size"] = 32; }))),
                 {"fc.weight", "shape"});
  expect_refused(run_tiny("--draft " + shell_quote(with_config("far-layer", [](json& c) {
                            c["dflash_config"]["target_layer_ids"] = {1, 9};
                          }))),
                 {"target layer id 9", "8 layers"});
  expect_refused(run_tiny("--draft " + shell_quote(with_config("wide-vocab", [](json& c) { c["vocab_size"] = 1024; }))),
                 {"vocabulary", "1024", "512"});
}

// ---- dflash serve ----------------------------------------------------------------------------------------

// A `dflash serve` under test (the bundled model, one thread, a free port); the destructor stops it.
// (A minimal copy of serve_test.cpp's Serve fixture: start, wait for /health, GET and POST JSON.)
using Server = test::ServeProcess;

json ask_body(bool stream = false) {
  json b = {{"messages", {{{"role", "user"}, {"content", kAsk}}}}, {"max_tokens", kTokens}, {"temperature", 0}};
  if (stream) {
    b["stream"] = true;
    b["stream_options"] = {{"include_usage", true}};
  }
  return b;
}

// A streamed reply put together: the message as a plain reply has it, and the usage chunk.
struct StreamedReply {
  json message = {{"role", "assistant"}};
  json usage;
  bool done = false;
};

StreamedReply read_stream(const std::string& body) {
  StreamedReply s;
  std::string content, reasoning;
  for (size_t pos = 0; (pos = body.find("data: ", pos)) != std::string::npos;) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string payload = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      s.done = true;
      continue;
    }
    const json c = json::parse(payload, nullptr, false);
    if (c.contains("usage") && c["usage"].is_object()) s.usage = c["usage"];
    if (!c.contains("choices") || c["choices"].empty()) continue;
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (d.contains("reasoning_content") && d["reasoning_content"].is_string())
      reasoning += d["reasoning_content"].get<std::string>();
  }
  s.message["content"] = content;
  if (!reasoning.empty()) s.message["reasoning_content"] = reasoning;
  return s;
}

// A speculative usage object: its figures agree with each other and with the completion.
void expect_speculative_usage(const json& u) {
  ASSERT_TRUE(u.contains("speculative")) << u.dump();
  ASSERT_TRUE(u.contains("completion_tokens_details")) << u.dump();
  const json& s = u["speculative"];
  const int64_t steps = s["steps"], drafted = s["drafted"], accepted = s["accepted"], plain = s["plain_tokens"];
  EXPECT_GT(steps, 0) << u.dump();
  EXPECT_GE(drafted, accepted) << u.dump();
  EXPECT_EQ(u["completion_tokens_details"]["accepted_prediction_tokens"], accepted) << u.dump();
  EXPECT_EQ(u["completion_tokens_details"]["rejected_prediction_tokens"], drafted - accepted) << u.dump();
  EXPECT_NEAR(s["acceptance_length"].get<double>(), static_cast<double>(accepted + steps) / steps, 1e-9) << u.dump();
  EXPECT_EQ(steps + accepted + plain, u["completion_tokens"].get<int64_t>()) << u.dump();
  // accepted_at[d]: steps that kept the drafted token at depth d + 1; a step keeps a prefix of its drafts.
  int64_t sum = 0;
  for (size_t d = 0; d < s["accepted_at"].size(); ++d) {
    sum += s["accepted_at"][d].get<int64_t>();
    if (d > 0) {
      EXPECT_LE(s["accepted_at"][d], s["accepted_at"][d - 1]) << u.dump();
    }
  }
  EXPECT_LE(s["accepted_at"].empty() ? 0 : s["accepted_at"][0].get<int64_t>(), steps) << u.dump();
  EXPECT_EQ(sum, accepted) << u.dump();
}

// The value of an unlabelled Prometheus sample (-1 when absent).
double metric(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::stod(text.substr(at + key.size()));
}

// The reply of a server without a draft: what every draft must reproduce.
json plain_reply(const std::string& log) {
  Server plain;
  EXPECT_TRUE(plain.start({"--draft", "none"}, log));
  const json props = plain.props();
  EXPECT_EQ(props["speculative"]["enabled"], false) << props.dump();
  EXPECT_EQ(props["runtime"]["draft_residency"], "none") << props.dump();
  EXPECT_EQ(props["runtime"]["lazy_draft"], false) << props.dump();
  const json r = plain.chat(ask_body());
  EXPECT_TRUE(r.is_object()) << "see " << plain.log();
  if (!r.is_object()) return json();
  EXPECT_FALSE(r["usage"].contains("speculative")) << r.dump();
  EXPECT_FALSE(r["usage"].contains("completion_tokens_details")) << r.dump();
  EXPECT_EQ(r["usage"]["completion_tokens"], kTokens) << r.dump();
  return r;
}

TEST(SpeculativeServe, bundled_draft_replies_equal_plain_decoding_and_report_acceptance) {
  const std::string dir = test::scratch_dir();
  const json want = plain_reply(dir + "/plain.log");
  ASSERT_TRUE(want.is_object());

  Server s;
  ASSERT_TRUE(s.start({}, dir + "/draft.log"));
  json props = s.props();
  const json& sp = props["speculative"];
  EXPECT_EQ(sp["enabled"], true) << props.dump();
  EXPECT_EQ(sp["mode"], "chain") << props.dump();
  EXPECT_EQ(sp["adaptive"], true) << props.dump();
  EXPECT_NE(sp["draft"].get<std::string>().find("default-coder-19m-dflash"), std::string::npos) << props.dump();
  EXPECT_EQ(sp["parked"], false) << props.dump();
  EXPECT_GT(sp["draft_bytes"].get<int64_t>(), 0) << props.dump();
  EXPECT_EQ(sp["resident_bytes"], sp["draft_bytes"]) << props.dump();
  EXPECT_EQ(sp["requests"], 0) << props.dump();
  EXPECT_EQ(props["runtime"]["draft_residency"], "auto") << props.dump();
  EXPECT_EQ(props["runtime"]["lazy_draft"], false) << props.dump();

  const json r = s.chat(ask_body());
  ASSERT_TRUE(r.is_object()) << "see " << s.log();
  EXPECT_EQ(r["choices"][0]["message"], want["choices"][0]["message"]);
  EXPECT_EQ(r["usage"]["completion_tokens"], want["usage"]["completion_tokens"]);
  const json& u = r["usage"];
  expect_speculative_usage(u);
  EXPECT_GT(u["speculative"]["accepted"].get<int64_t>(), 0) << "the trained draft should accept some: " << u.dump();
  EXPECT_EQ(r["timings"]["draft_n"], u["speculative"]["drafted"]) << r.dump();
  EXPECT_EQ(r["timings"]["draft_n_accepted"], u["speculative"]["accepted"]) << r.dump();

  // Streamed (after the first request: its prompt's prefix comes from the prefix cache, with the draft's
  // feature window): the same message, and a usage chunk with the speculative figures.
  const StreamedReply st = read_stream(s.chat_stream(ask_body(true)));
  EXPECT_TRUE(st.done);
  EXPECT_EQ(st.message, want["choices"][0]["message"]);
  ASSERT_TRUE(st.usage.is_object()) << "no usage chunk; see " << s.log();
  expect_speculative_usage(st.usage);

  // /metrics and /props add up both requests.
  const std::string m = s.metrics();
  auto both = [&](const char* field) {
    return u["speculative"][field].get<double>() + st.usage["speculative"][field].get<double>();
  };
  EXPECT_GT(metric(m, "dflash_spec_steps_total"), 0) << m;
  EXPECT_EQ(metric(m, "dflash_spec_steps_total"), both("steps")) << m;
  EXPECT_EQ(metric(m, "dflash_spec_drafted_tokens_total"), both("drafted")) << m;
  EXPECT_EQ(metric(m, "dflash_spec_accepted_tokens_total"), both("accepted")) << m;
  EXPECT_EQ(metric(m, "dflash_spec_plain_tokens_total"), both("plain_tokens")) << m;
  EXPECT_NE(m.find("dflash_spec_accepted_at_total{depth=\"1\"} " +
                   std::to_string(u["speculative"]["accepted_at"][0].get<int64_t>() +
                                  st.usage["speculative"]["accepted_at"][0].get<int64_t>()) + "\n"),
            std::string::npos)
      << m;
  props = s.props();
  EXPECT_EQ(props["speculative"]["requests"], 2) << props.dump();
  EXPECT_EQ(props["speculative"]["steps"].get<double>(), both("steps")) << props.dump();
  EXPECT_EQ(props["speculative"]["accepted"].get<double>(), both("accepted")) << props.dump();
  EXPECT_GT(props["speculative"]["mean_acceptance_length"].get<double>(), 1.0) << props.dump();
}

// Request-scoped residency: the draft is loaded for a request and released after it, and the replies are
// those of a draft that stays loaded.
TEST(SpeculativeServe, lazy_draft_is_parked_between_requests_and_replies_alike) {
  const std::string dir = test::scratch_dir();
  json want;
  {
    Server persistent;
    ASSERT_TRUE(persistent.start({"--draft-residency", "persistent"}, dir + "/persistent.log"));
    const json props = persistent.props();
    EXPECT_EQ(props["runtime"]["draft_residency"], "persistent") << props.dump();
    EXPECT_EQ(props["runtime"]["lazy_draft"], false) << props.dump();
    EXPECT_EQ(props["speculative"]["parked"], false) << props.dump();
    want = persistent.chat(ask_body());
    ASSERT_TRUE(want.is_object()) << "see " << persistent.log();
    EXPECT_EQ(persistent.props()["speculative"]["parked"], false);
  }

  Server lazy;
  ASSERT_TRUE(lazy.start({"--lazy-draft"}, dir + "/lazy.log"));
  json props = lazy.props();
  EXPECT_EQ(props["runtime"]["draft_residency"], "request-scoped") << props.dump();
  EXPECT_EQ(props["runtime"]["lazy_draft"], true) << props.dump();
  EXPECT_EQ(props["speculative"]["enabled"], true) << props.dump();
  EXPECT_EQ(props["speculative"]["parked"], true) << props.dump();
  EXPECT_EQ(props["speculative"]["unparks"], 0) << props.dump();
  EXPECT_EQ(props["speculative"]["resident_bytes"], 0) << props.dump();
  EXPECT_GT(props["speculative"]["draft_bytes"].get<int64_t>(), 0) << props.dump();

  for (int i = 1; i <= 2; ++i) {  // the second restores its prompt from the prefix cache
    SCOPED_TRACE("request " + std::to_string(i));
    const json r = lazy.chat(ask_body());
    ASSERT_TRUE(r.is_object()) << "see " << lazy.log();
    EXPECT_EQ(r["choices"][0]["message"], want["choices"][0]["message"]);
    expect_speculative_usage(r["usage"]);
    props = lazy.props();
    EXPECT_EQ(props["speculative"]["parked"], true) << props.dump();
    EXPECT_EQ(props["speculative"]["unparks"], i) << props.dump();
    EXPECT_GT(props["speculative"]["last_unpark_ms"].get<double>(), 0) << props.dump();
    EXPECT_EQ(props["speculative"]["resident_bytes"], 0) << props.dump();
  }

  // The underscore spelling is the same policy.
  Server underscore;
  ASSERT_TRUE(underscore.start({"--draft-residency", "request_scoped"}, dir + "/underscore.log"));
  props = underscore.props();
  EXPECT_EQ(props["runtime"]["draft_residency"], "request-scoped") << props.dump();
  EXPECT_EQ(props["runtime"]["lazy_draft"], true) << props.dump();
  EXPECT_EQ(props["speculative"]["parked"], true) << props.dump();
}

TEST(SpeculativeServe, ddtree_replies_equal_plain_decoding) {
  const std::string dir = test::scratch_dir();
  const json want = plain_reply(dir + "/plain.log");
  ASSERT_TRUE(want.is_object());
  Server s;
  ASSERT_TRUE(s.start({"--ddtree", "--ddtree-budget", "12"}, dir + "/ddtree.log"));
  const json props = s.props();
  EXPECT_EQ(props["speculative"]["enabled"], true) << props.dump();
  EXPECT_EQ(props["speculative"]["mode"], "ddtree") << props.dump();
  EXPECT_EQ(props["speculative"]["ddtree_budget"], 12) << props.dump();
  const json r = s.chat(ask_body());
  ASSERT_TRUE(r.is_object()) << "see " << s.log();
  EXPECT_EQ(r["choices"][0]["message"], want["choices"][0]["message"]);
  expect_speculative_usage(r["usage"]);
  const StreamedReply st = read_stream(s.chat_stream(ask_body(true)));
  EXPECT_EQ(st.message, want["choices"][0]["message"]);
  ASSERT_TRUE(st.usage.is_object()) << "no usage chunk; see " << s.log();
  expect_speculative_usage(st.usage);
}

// serve listens before it loads: a draft that cannot load ends it with the reason, exit code 1.
TEST(SpeculativeServe, a_bad_draft_stops_the_server_with_a_clear_error) {
  const std::string dir = test::scratch_dir();
  const std::string log = dir + "/serve.log";
  test::ChildProcess p({DFLASH_BIN, "serve", tiny_target(), "--port", std::to_string(test::free_port()), "--threads",
                        "1", "--draft", test::fixture_path("models/tiny-qwen3")},
                       log);
  ASSERT_TRUE(p.started());
  for (int i = 0; i < 300 && p.running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_FALSE(p.running()) << "the server should have exited; see " << log;
  EXPECT_EQ(p.stop(), 1);
  const auto text = read_text_file(log);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("not a DFlash draft"), std::string::npos) << *text;
}

}  // namespace
}  // namespace dflash
