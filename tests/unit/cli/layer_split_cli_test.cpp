// The target layer split (FEATURES.md F2, F3) through the real binary: `run` and `logits` on a split of the
// bundled model (two, three uneven, eight one-layer shards of CPU) give exactly one device's output, plain and
// speculative; bad --target-devices / --target-layer-split are clear errors in serve, run, logits and bench; a
// split server restores its disk snapshots (draft feature window included) after a restart of the same
// placement, and never another placement's; /props shows the shards, and bench counts the hand-offs.
#include <httplib.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
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
constexpr int kRunTokens = 48;
constexpr int kServeTokens = 32;

std::string bundled_model() { return test::source_dir() + "/models/default-coder-19m-q8_0.gguf"; }

// The placements every exactness test compares with one device, and how run's stderr names them
// ("loaded on <name> in"): shard i ends at round(Σw_≤i / Σw · 8).
struct Placement {
  std::string flags;
  std::string name;
};
const std::vector<Placement>& splits() {
  static const std::vector<Placement> p = {
      {"--target-devices cpu,cpu", "cpu[0,4) cpu[4,8)"},
      {"--target-devices cpu,cpu,cpu --target-layer-split 1,2,3", "cpu[0,1) cpu[1,4) cpu[4,8)"},
      {"--target-devices cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu",
       "cpu[0,1) cpu[1,2) cpu[2,3) cpu[3,4) cpu[4,5) cpu[5,6) cpu[6,7) cpu[7,8)"},
  };
  return p;
}

test::CommandResult dflash(const std::string& args) { return test::run_command(shell_quote(DFLASH_BIN) + " " + args); }

// `dflash run` on the bundled model, greedy.
test::CommandResult run_bundled(const std::string& extra) {
  return dflash("run --chat -p " + shell_quote(kAsk) + " -n " + std::to_string(kRunTokens) +
                " --threads 1 --temperature 0 " + extra);
}

// run's stderr line "speculative: N steps, drafted D, accepted A, ..." (empty when it did not draft).
std::string speculative_line(const std::string& err) {
  const size_t at = err.find("speculative: ");
  if (at == std::string::npos) return std::string();
  return err.substr(at, err.find('\n', at) - at);
}

// One device, then each split: the same text (and, with a draft, the same drafting: the features are
// captured from whichever shard owns each capture layer, so the draft sees the same numbers).
void expect_splits_run_like_one_device(const std::string& mode, bool drafts) {
  const auto one = run_bundled(mode);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_GT(one.out.size(), 20u) << one.err;
  EXPECT_NE(one.err.find("loaded on cpu in"), std::string::npos) << one.err;
  const std::string spec = speculative_line(one.err);
  if (drafts) {
    long long steps = 0, drafted = 0, accepted = 0;
    ASSERT_EQ(std::sscanf(spec.c_str(), "speculative: %lld steps, drafted %lld, accepted %lld", &steps, &drafted,
                          &accepted),
              3)
        << one.err;
    EXPECT_GT(drafted, 0) << one.err;
    EXPECT_GT(accepted, 0) << "the trained draft should accept some of a code reply: " << one.err;
  } else {
    EXPECT_TRUE(spec.empty()) << one.err;
  }
  for (const Placement& p : splits()) {
    SCOPED_TRACE(p.flags);
    const auto r = run_bundled(mode + " " + p.flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("loaded on " + p.name + " in"), std::string::npos) << "not split as asked: " << r.err;
    EXPECT_EQ(r.out, one.out);
    EXPECT_EQ(speculative_line(r.err), spec) << r.err;
  }
}

TEST(LayerSplitRun, plain_greedy_text_equals_one_device) { expect_splits_run_like_one_device("--draft none", false); }

TEST(LayerSplitRun, dflash_chain_greedy_text_equals_one_device) {
  expect_splits_run_like_one_device("--no-adaptive-draft", true);
}

TEST(LayerSplitRun, ddtree_greedy_text_equals_one_device) {
  expect_splits_run_like_one_device("--ddtree --no-adaptive-draft", true);
}

// `dflash logits --all` on a split writes the same bytes (every position's logits, and the top-5 sidecar) as on
// one device, on the bundled model and on the tiny fixtures of both families (the split is generic).
TEST(LayerSplitLogits, every_positions_logits_equal_one_device_bit_for_bit) {
  const std::string dir = test::scratch_dir();
  struct Case {
    std::string model;
    std::vector<std::string> split_flags;
  };
  const std::vector<Case> cases = {
      {bundled_model(), {splits()[0].flags, splits()[1].flags, splits()[2].flags}},
      {test::fixture_path("models/tiny-qwen3"),
       {"--target-devices cpu,cpu", "--target-devices cpu,cpu,cpu --target-layer-split 1,2,3"}},
      {test::fixture_path("models/tiny-qwen35"),
       {"--target-devices cpu,cpu", "--target-devices cpu,cpu,cpu --target-layer-split 1,2,3"}},
  };
  const std::string tokens = "1,2,3,100,200,300,400,17,42,511,7,99";  // inside every vocabulary here
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model);
    const std::string want_out = dir + "/one.bin";
    const auto one = dflash("logits -m " + shell_quote(c.model) + " --tokens " + tokens + " --all --threads 1 -o " +
                            shell_quote(want_out));
    ASSERT_EQ(one.exit_code, 0) << one.err;
    const std::vector<uint8_t> want = test::read_bytes(want_out), want_meta = test::read_bytes(want_out + ".json");
    ASSERT_GT(want.size(), 12u * 4 * 100);
    ASSERT_FALSE(want_meta.empty());
    for (size_t i = 0; i < c.split_flags.size(); ++i) {
      SCOPED_TRACE(c.split_flags[i]);
      const std::string out = dir + "/split" + std::to_string(i) + ".bin";
      const auto r = dflash("logits -m " + shell_quote(c.model) + " --tokens " + tokens + " --all --threads 1 -o " +
                            shell_quote(out) + " " + c.split_flags[i]);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_TRUE(test::read_bytes(out) == want) << "the logits differ from one device's";
      EXPECT_TRUE(test::read_bytes(out + ".json") == want_meta) << "the sidecar differs from one device's";
    }
  }
}

// ---- bad flags ------------------------------------------------------------------------------------------

// A placement that must be refused, and what the message must say (the flag at least).
struct BadPlacement {
  std::vector<std::string> flags;
  std::vector<std::string> says;
  bool needs_model = false;  // refused only once the model's layer count is known
};

const std::vector<BadPlacement>& bad_placements() {
  static const std::vector<BadPlacement> b = {
      {{"--target-devices", "cuda:0,cuda:0"}, {"--target-devices", "cuda:0", "twice"}},
      {{"--target-devices", "tpu:0"}, {"--target-devices", "tpu:0"}},
      {{"--target-devices", "cpu,,cpu"}, {"--target-devices", "empty"}},
      {{"--target-devices", "cpu,cpu,"}, {"--target-devices", "empty"}},
      {{"--target-devices", "cpu,cpu", "--target-layer-split", "1"}, {"--target-layer-split", "2 devices"}},
      {{"--target-devices", "cpu,cpu", "--target-layer-split", "1,2,3"}, {"--target-layer-split", "2 devices"}},
      {{"--target-devices", "cpu,cpu", "--target-layer-split", "1,0"}, {"--target-layer-split", "'0'"}},
      {{"--target-devices", "cpu,cpu", "--target-layer-split", "-2,1"}, {"--target-layer-split", "'-2'"}},
      {{"--target-devices", "cpu,cpu", "--target-layer-split", "1,abc"}, {"--target-layer-split", "'abc'"}},
      {{"--target-devices", "cpu,cpu", "--target-layer-split", "1,inf"}, {"--target-layer-split", "'inf'"}},
      {{"--target-layer-split", "1,1"}, {"--target-layer-split", "--target-devices"}},
      {{"--device", "cuda:0", "--target-devices", "cpu,cpu"}, {"--device", "--target-devices"}},
      {{"--prefill-chunk", "-3"}, {"--prefill-chunk", "-3"}},  // registered with the placement flags
      {{"--prefill-chunk", "99999999"}, {"--prefill-chunk", "99999999"}},
      // Known only with the model: 9 shards for 8 layers; weights so uneven that a shard rounds to no layer
      // (1,1000: shard 0 ends at round(8/1001) = 0; 15,1: shard 0 ends at round(7.5) = 8, leaving none).
      {{"--target-devices", "cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu"}, {"--target-devices", "9", "8 layers"}, true},
      {{"--target-devices", "cpu,cpu", "--target-layer-split", "1,1000"}, {"--target-layer-split", "shard 0"}, true},
      {{"--target-devices", "cpu,cpu", "--target-layer-split", "15,1"}, {"--target-layer-split", "shard 1"}, true},
  };
  return b;
}

std::string joined(const std::vector<std::string>& flags) {
  std::string s;
  for (const std::string& f : flags) {
    s += ' ';
    s += shell_quote(f);
  }
  return s;
}

void expect_says(const std::string& text, const std::vector<std::string>& says) {
  for (const std::string& s : says) EXPECT_NE(text.find(s), std::string::npos) << "want '" << s << "' in: " << text;
}

// `dflash serve` (the bundled model, any free port) with `flags`: waits up to 30 s for it to exit; its exit code
// (-1 if it did not) and its log.
std::pair<int, std::string> serve_exit(const std::vector<std::string>& flags, const std::string& log) {
  std::vector<std::string> argv = {DFLASH_BIN, "serve", "--port", "0", "--threads", "1", "--draft", "none"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  test::ChildProcess p(argv, log);
  if (!p.started()) return {-1, "not started"};
  for (int i = 0; i < 300 && p.running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const bool exited = !p.running();
  const int code = p.stop();
  auto text = read_text_file(log);
  return {exited ? code : -1, text.ok() ? *text : std::string()};
}

// Every bad placement through `run`; each through one of logits, bench and serve too (in turn, so that each of
// them refuses flag-only mistakes and one that needs the model): they share one loader, which this pins.
TEST(LayerSplitFlags, bad_placements_are_clear_errors_in_every_command) {
  const std::string dir = test::scratch_dir();
  const std::string model = shell_quote(bundled_model());
  const std::vector<BadPlacement>& bad = bad_placements();
  for (size_t i = 0; i < bad.size(); ++i) {
    const BadPlacement& b = bad[i];
    const std::string flags = joined(b.flags);
    SCOPED_TRACE(flags);
    const auto run = dflash("run -m " + model + " -p hi -n 2 --threads 1 --draft none" + flags);
    EXPECT_NE(run.exit_code, 0) << run.err;
    EXPECT_TRUE(run.out.empty()) << run.out;
    expect_says(run.err, b.says);
    switch (i % 3) {
      case 0: {
        SCOPED_TRACE("logits");
        const std::string out = dir + "/l" + std::to_string(i) + ".bin";
        const auto r = dflash("logits -m " + model + " --tokens 1,2,3 --threads 1 -o " + shell_quote(out) + flags);
        EXPECT_NE(r.exit_code, 0) << r.err;
        expect_says(r.err, b.says);
        EXPECT_FALSE(std::filesystem::exists(out));
        break;
      }
      case 1: {
        SCOPED_TRACE("bench");
        const auto r = dflash("bench -m " + model + " --prompt-len 4 --gen-len 2 --threads 1 --draft none --json" + flags);
        EXPECT_NE(r.exit_code, 0) << r.err;
        EXPECT_TRUE(r.out.empty()) << r.out;
        expect_says(r.err, b.says);
        break;
      }
      default: {
        SCOPED_TRACE("serve");
        const auto [code, log] = serve_exit(b.flags, dir + "/serve" + std::to_string(i) + ".log");
        EXPECT_NE(code, -1) << "the server did not exit: " << log;
        EXPECT_NE(code, 0) << log;
        expect_says(log, b.says);
      }
    }
  }
}

// What can be checked without the model (device names, duplicates, weights, flag combinations) is refused
// before the server listens, like every other bad flag (ServeFlags in serve_test.cpp).
TEST(LayerSplitFlags, serve_refuses_malformed_placements_before_listening) {
  const std::string dir = test::scratch_dir();
  int n = 0;
  for (const BadPlacement& b : bad_placements()) {
    if (b.needs_model) continue;
    SCOPED_TRACE(joined(b.flags));
    const auto [code, log] = serve_exit(b.flags, dir + "/serve" + std::to_string(n++) + ".log");
    EXPECT_NE(code, 0) << log;
    EXPECT_EQ(log.find("listening on"), std::string::npos) << "listened before refusing: " << log;
  }
}

// --device and --target-devices are two ways to say where the target goes: both at once is refused, whichever
// device --device names.
TEST(LayerSplitFlags, device_and_target_devices_are_refused_together) {
  const std::string model = shell_quote(bundled_model());
  for (const std::string device : {"cpu", "cuda:0"}) {
    SCOPED_TRACE(device);
    const auto r = dflash("run -m " + model + " -p hi -n 2 --threads 1 --draft none --device " + device +
                          " --target-devices cpu,cpu");
    EXPECT_NE(r.exit_code, 0) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    expect_says(r.err, {"--device", "--target-devices"});
  }
}

// The rounding rule at its edge: 1,15 puts shard 0's end at round(0.5) = 1 (half away from zero), so both shards
// have layers; 15,1 (shard 0 ending at round(7.5) = 8) is refused above.
TEST(LayerSplitFlags, shard_ends_round_half_away_from_zero) {
  const auto r = dflash("run -m " + shell_quote(bundled_model()) +
                        " -p hi -n 2 --threads 1 --draft none --target-devices cpu,cpu --target-layer-split 1,15");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("loaded on cpu[0,1) cpu[1,8) in"), std::string::npos) << r.err;
  const auto w = dflash("run -m " + shell_quote(bundled_model()) +
                        " -p hi -n 2 --threads 1 --draft none --target-devices cpu,cpu --target-layer-split 0.25,0.75");
  ASSERT_EQ(w.exit_code, 0) << w.err;
  EXPECT_NE(w.err.find("loaded on cpu[0,2) cpu[2,8) in"), std::string::npos) << w.err;
}

// ---- dflash serve ----------------------------------------------------------------------------------------

// A `dflash serve` of the bundled model under test (one thread, a free port); the destructor stops it.
using Server = test::ServeProcess;

json ask_body() {
  return {{"messages", {{{"role", "user"}, {"content", kAsk}}}}, {"max_tokens", kServeTokens}, {"temperature", 0}};
}

// /props of a split server: its shards in layer order with their devices, layer ranges and weights (a shard
// holds only its layers': fewer layers, fewer bytes), both devices in runtime.devices, and the residual stream
// handed across both boundaries of every forward.
TEST(LayerSplitServe, props_show_the_shards_of_the_placement) {
  Server s;
  ASSERT_TRUE(s.start({"--draft", "none", "--target-devices", "cpu,cpu,cpu", "--target-layer-split", "1,2,3"},
                      test::scratch_dir() + "/serve.log"));
  json p = s.props();
  ASSERT_TRUE(p.is_object());
  const json& rt = p["runtime"];
  EXPECT_EQ(rt["devices"], json({"cpu", "cpu", "cpu"})) << rt.dump();
  const json& shards = rt["placement"]["shards"];
  ASSERT_EQ(shards.size(), 3u) << rt.dump();
  const json ranges = {{0, 1}, {1, 4}, {4, 8}};
  const auto model_bytes = static_cast<int64_t>(std::filesystem::file_size(bundled_model()));
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE("shard " + std::to_string(i));
    EXPECT_EQ(shards[i]["device"], "cpu") << rt.dump();
    EXPECT_EQ(shards[i]["layers"], ranges[i]) << rt.dump();
    EXPECT_GT(shards[i]["weight_bytes"].get<int64_t>(), 0) << rt.dump();
    EXPECT_LT(shards[i]["weight_bytes"].get<int64_t>(), model_bytes) << rt.dump();
  }
  // Each shard holds only its layers' weights (and the embedding or head where it lives): layers [1,4) hold fewer
  // bytes than layers [4,8) with the (tied) head, layer 0 with the embedding fewer than layers 4..7 with it.
  EXPECT_LT(shards[1]["weight_bytes"].get<int64_t>(), shards[2]["weight_bytes"].get<int64_t>()) << rt.dump();
  EXPECT_LT(shards[0]["weight_bytes"].get<int64_t>(), shards[2]["weight_bytes"].get<int64_t>()) << rt.dump();
  EXPECT_EQ(rt["placement"]["handoffs"], 0) << rt.dump();

  const json r = s.chat(ask_body());
  ASSERT_TRUE(r.is_object()) << "see " << s.log_text();
  p = s.props();
  const json& pl = p["runtime"]["placement"];
  const int64_t handoffs = pl["handoffs"].get<int64_t>();
  EXPECT_GT(handoffs, 0) << pl.dump();
  EXPECT_EQ(handoffs % 2, 0) << "three shards: two hand-offs a forward: " << pl.dump();
  EXPECT_GT(pl["handoff_bytes"].get<int64_t>(), 0) << pl.dump();
  EXPECT_GT(pl["shards"][2]["memory_peak_bytes"].get<int64_t>(), 0) << pl.dump();
}

// The disk cache of a split target (F3): a restarted server of the same placement adopts the snapshot (its
// tensors under "ls<shard>_" names, with the draft's feature window), replies as before and still drafts as
// before; a server of another placement (three shards, one device) adopts none of it and replies the same.
TEST(LayerSplitServe, disk_snapshots_restore_on_the_same_placement_only) {
  namespace fs = std::filesystem;
  const std::string scratch = test::scratch_dir(), dir = scratch + "/kv";
  const std::vector<std::string> disk = {"--kv-cache-dir", dir, "--kv-cache-min-tokens", "1", "--no-adaptive-draft"};
  auto with = [&](std::vector<std::string> placement) {
    placement.insert(placement.end(), disk.begin(), disk.end());
    return placement;
  };
  // Session 1: two shards, a cold request; its snapshot is written.
  json first;
  std::set<std::string> written;
  {
    Server s;
    ASSERT_TRUE(s.start(with({"--target-devices", "cpu,cpu"}), scratch + "/split1.log"));
    const json p = s.props();
    EXPECT_EQ(p["runtime"]["devices"], json({"cpu", "cpu"})) << p.dump();
    EXPECT_EQ(p["speculative"]["enabled"], true) << p.dump();
    first = s.chat(ask_body());
    ASSERT_TRUE(first.is_object()) << "see " << s.log_text();
    EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << first.dump();
    EXPECT_GT(first["usage"]["speculative"]["drafted"].get<int64_t>(), 0) << first.dump();
    ASSERT_TRUE(s.wait_written(1));
  }
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) written.insert(e.path().filename().string());
  ASSERT_FALSE(written.empty());
  // The file holds each shard's tensors under its shard's name, and the draft's feature window.
  const std::vector<uint8_t> bytes = test::read_bytes(dir + "/" + *written.begin());
  const std::string text(bytes.begin(), bytes.end());
  for (const char* name : {"ls0_", "ls1_", "dflash_feature_data", "snap_prefill_logits"})
    EXPECT_NE(text.find(name), std::string::npos) << name;
  const int64_t prompt_tokens = first["usage"]["prompt_tokens"].get<int64_t>();

  // Session 2, the same placement: a disk hit of the whole prompt, the same reply, the same drafting.
  {
    Server s;
    ASSERT_TRUE(s.start(with({"--target-devices", "cpu,cpu"}), scratch + "/split2.log"));
    EXPECT_EQ(s.props()["cache"]["disk_entries"].get<size_t>(), written.size());
    const json r = s.chat(ask_body());
    ASSERT_TRUE(r.is_object()) << "see " << s.log_text();
    EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens) << r.dump();
    EXPECT_EQ(r["choices"][0]["message"], first["choices"][0]["message"]);
    const json& sp = r["usage"]["speculative"];
    ASSERT_TRUE(sp.is_object()) << "the restored request did not draft: " << r.dump();
    EXPECT_GT(sp["drafted"].get<int64_t>(), 0) << r.dump();
    EXPECT_GT(sp["accepted"].get<int64_t>(), 0) << r.dump();
    for (const char* k : {"steps", "drafted", "accepted", "plain_tokens"})
      EXPECT_EQ(sp[k], first["usage"]["speculative"][k]) << k << ": " << r.dump() << " vs " << first.dump();
    EXPECT_EQ(s.props()["cache"]["disk_hits"], 1);
    EXPECT_NE(s.log_text().find("disk_hit=true restore=true pos=" + std::to_string(prompt_tokens)), std::string::npos)
        << s.log_text();
  }

  // Another placement (three shards), then one device: the two-shard files are not theirs (no hit, not
  // counted, left in place), and the replies are the same; one device's is the oracle of all of them.
  for (const std::vector<std::string>& other :
       {std::vector<std::string>{"--target-devices", "cpu,cpu,cpu"}, std::vector<std::string>{}}) {
    SCOPED_TRACE(other.empty() ? "one device" : other[1]);
    Server s;
    ASSERT_TRUE(s.start(with(other), scratch + "/other" + std::to_string(other.size()) + ".log"));
    EXPECT_EQ(s.props()["cache"]["disk_entries"], 0);
    const json r = s.chat(ask_body());
    ASSERT_TRUE(r.is_object()) << "see " << s.log_text();
    EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << r.dump();
    EXPECT_EQ(r["choices"][0]["message"], first["choices"][0]["message"]);
    EXPECT_GT(r["usage"]["speculative"]["drafted"].get<int64_t>(), 0) << r.dump();
    EXPECT_EQ(s.props()["cache"]["disk_hits"], 0);
    EXPECT_EQ(s.log_text().find("disk_hit=true"), std::string::npos) << s.log_text();
    ASSERT_TRUE(s.wait_written(1));
  }
  for (const std::string& name : written) EXPECT_TRUE(fs::exists(dir + "/" + name)) << name << " was removed";
}

// --prefill-chunk (registered with the placement flags): /props runtime.prefill_chunk reports the tokens a prefill
// step takes (512 on the CPU by default), and a prompt prefilled in 8-token steps is answered.
TEST(PrefillChunkServe, the_chunk_is_reported_and_used) {
  const std::string scratch = test::scratch_dir();
  {
    Server s;
    ASSERT_TRUE(s.start({"--draft", "none"}, scratch + "/chunk_default.log"));
    EXPECT_EQ(s.props()["runtime"]["prefill_chunk"], 512);
  }
  Server s;
  ASSERT_TRUE(s.start({"--draft", "none", "--prefill-chunk", "8"}, scratch + "/chunk8.log"));
  EXPECT_EQ(s.props()["runtime"]["prefill_chunk"], 8);
  const json r = s.chat(ask_body());
  ASSERT_TRUE(r.is_object()) << "see " << s.log_text();
  EXPECT_GT(r["usage"]["prompt_tokens"].get<int64_t>(), 8);  // several steps
}

// --kv-type f16 (registered with the placement flags): /props reports it, requests are answered, and its disk
// snapshots are its own: an f32 server's files are not restored by an f16 one (f16 KV changes what later
// layers read, so such a restore would not continue like a cold prefill), while an f16 restart hits its own.
TEST(KvTypeServe, f16_kv_is_reported_and_keeps_its_own_disk_snapshots) {
  const std::string scratch = test::scratch_dir(), dir = scratch + "/kv16";
  const std::vector<std::string> disk = {"--kv-cache-dir", dir, "--kv-cache-min-tokens", "1", "--draft", "none"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), disk.begin(), disk.end());
    return args;
  };
  {
    Server s;  // f32: writes its snapshot
    ASSERT_TRUE(s.start(with({}), scratch + "/kv32.log"));
    EXPECT_EQ(s.props()["runtime"]["kv_type"], "f32");
    ASSERT_TRUE(s.chat(ask_body()).is_object()) << "see " << s.log_text();
    ASSERT_TRUE(s.wait_written(1));
  }
  json first;
  for (int session = 0; session < 2; ++session) {
    SCOPED_TRACE("f16 session " + std::to_string(session));
    Server s;
    ASSERT_TRUE(s.start(with({"--kv-type", "f16"}), scratch + "/kv16_" + std::to_string(session) + ".log"));
    const json p = s.props();
    EXPECT_EQ(p["runtime"]["kv_type"], "f16") << p.dump();
    EXPECT_EQ(p["cache"]["disk_entries"], session == 0 ? 0 : 1) << p.dump();
    const json r = s.chat(ask_body());
    ASSERT_TRUE(r.is_object()) << "see " << s.log_text();
    const int64_t cached = r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    if (session == 0) {
      EXPECT_EQ(cached, 0) << r.dump();
      first = r;
      ASSERT_TRUE(s.wait_written(1));
    } else {
      EXPECT_EQ(cached, r["usage"]["prompt_tokens"].get<int64_t>()) << r.dump();
      EXPECT_EQ(r["choices"][0]["message"], first["choices"][0]["message"]);
    }
  }
}

// ---- dflash bench ----------------------------------------------------------------------------------------

// bench on a split names the placement and counts one hand-off per boundary per decode step (none on one
// device); with the bundled draft, speculative decoding on the split still reproduces plain decoding's text.
TEST(LayerSplitBench, reports_the_placement_and_one_hand_off_per_boundary_per_token) {
  const std::string base = "bench -m " + shell_quote(bundled_model()) + " --prompt-len 16 --gen-len 8 --threads 1 --json ";
  struct Case {
    std::string flags;
    std::string backend;
    double handoffs;
  };
  const std::vector<Case> cases = {
      {"--target-devices cpu,cpu", "cpu[0,4) cpu[4,8)", 1.0},
      {"--draft none --target-devices cpu,cpu,cpu --target-layer-split 1,2,3", "cpu[0,1) cpu[1,4) cpu[4,8)", 2.0},
      {"--draft none", "cpu", 0.0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    const auto r = dflash(base + c.flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_EQ(j["backend"], c.backend) << r.out;
    EXPECT_EQ(j["handoffs_per_token"].get<double>(), c.handoffs) << r.out;
    EXPECT_GT(j["decode_tok_s"].get<double>(), 0) << r.out;
    if (c.flags.find("--draft none") == std::string::npos) {
      ASSERT_TRUE(j["speculative"].is_object()) << r.out;
      EXPECT_EQ(j["speculative"]["same_text"], true) << r.out;
    }
  }
}

}  // namespace
}  // namespace dflash
