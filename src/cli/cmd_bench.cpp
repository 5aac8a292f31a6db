// dflash bench: the one benchmark entry point.
//   dflash bench --make-random SHAPE --type T -o file.gguf   random weights of a real model's shape
//   dflash bench --model M --prompt-len N --gen-len N        prefill / decode speed beside their ceilings
// Each figure is printed with the ceiling it is compared with and the ratio (docs/benchmarks.md).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "cli/commands.h"
#include "cli/draft_loader.h"
#include "cli/model_loader.h"
#include "decode/dflash.h"
#include "decode/profiling_backend.h"
#include "decode/runner.h"
#include "model/random_model.h"
#include "model/weights.h"
#include "state/sequence_state.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/load_tokenizer.h"

namespace dflash::cli {
namespace {

struct BenchOptions {
  std::string make_random;
  std::string type = "q4_k_m";
  std::string out;
  std::string tokenizer;
  uint64_t seed = 1;
  int64_t distinct_rows = 0;  // --make-random: rows generated a tensor, repeated after (0: all)
  std::string model;
  int64_t prompt_len = 512;
  int64_t gen_len = 64;
  int threads = 0;
  PlacementFlags where;  // --device, or --target-devices and --target-layer-split
  int64_t profile = 0;  // decode steps to profile per op (0: none)
  int reps = 3;         // prefill runs: the first is cold (TTFT), the prefill rate is the median of the others
  bool profile_prefill = false;  // also profile one prefill of the prompt per op
  std::vector<int64_t> verify_cost;  // verify-shaped steps of these token counts, timed beside a plain step
  bool verify_tree = false;          // those steps tree-shaped (DDTree's mask and per-node states), not chains
  bool json = false;
  DraftOptions draft;   // speculative decoding beside plain decoding (when a draft is given or bundled)
  std::string prompt;   // a real prompt for the speculative run (drafts accept on real text, not random ids)
  bool chat = false;    // wrap --prompt in the chat template
  bool no_spec_graphs = false;  // draft and verify steps eagerly (plain decode steps stay recorded)
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The median of timings (the upper one of an even count); v must not be empty.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Status make_random(const BenchOptions& opt) {
  if (opt.out.empty()) return invalid_argument("--make-random needs -o FILE.gguf");
  auto ft = file_type_from_name(opt.type);
  if (!ft) return invalid_argument("--type {} is not a file type dflash writes (e.g. f32, bf16, q8_0, q4_k_m)", opt.type);
  DF_ASSIGN_OR_RETURN(ModelSpec spec, random_model_spec(opt.make_random));
  GgufWriter w;
  if (!opt.tokenizer.empty()) {
    DF_ASSIGN_OR_RETURN(Vocab vocab, load_vocab(opt.tokenizer));
    if (vocab.size() > spec.vocab)
      return invalid_argument("the tokenizer has {} tokens, more than the shape's vocabulary of {}", vocab.size(),
                              spec.vocab);
    DF_RETURN_IF_ERROR(write_tokenizer_to_gguf(vocab, spec.vocab, w));
  } else {
    w.set("tokenizer.ggml.model", GgufValue::string("none"));
  }
  DF_RETURN_IF_ERROR(add_random_model(spec, *ft, opt.seed, opt.threads, w, opt.distinct_rows));
  const double t0 = now_s();
  log::info("bench: writing {} ({} tensors) to {}", spec.summary(), w.tensor_count(), opt.out);
  DF_RETURN_IF_ERROR(w.write(opt.out));
  log::info("bench: wrote {} in {:.1f} s", opt.out, now_s() - t0);
  return Status();
}

// Host memory bandwidth, bytes read + written per second, by a threaded copy of 256 MiB (best of 5).
double measure_host_bandwidth(ThreadPool& pool) {
  const size_t n = size_t{256} << 20;
  std::vector<uint8_t> a(n, 1), b(n, 0);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_s();
    pool.parallel_for(static_cast<int64_t>(n), int64_t{1} << 20, [&](int64_t lo, int64_t hi) {
      std::memcpy(b.data() + lo, a.data() + lo, static_cast<size_t>(hi - lo));
    });
    best = std::max(best, 2.0 * n / (now_s() - t0));
  }
  return best;
}

// Device copy rate (bytes read + written per second) of a 1 GiB copy on the backend, best of 5.
Result<double> measure_device_bandwidth(Backend& be) {
  const int64_t n = int64_t{128} << 20;  // floats
  DF_ASSIGN_OR_RETURN(Buffer a, be.alloc(n));
  DF_ASSIGN_OR_RETURN(Buffer b, be.alloc(n));
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    DF_RETURN_IF_ERROR(be.synchronize());
    const double t0 = now_s();
    DF_RETURN_IF_ERROR(be.copy(b.data(), a.data(), n));
    DF_RETURN_IF_ERROR(be.synchronize());
    best = std::max(best, 2.0 * 4.0 * n / (now_s() - t0));
  }
  return best;
}

// Bytes a decode step must move: every weight once (the embedding table only one row unless it is also
// the head), KV of the attention layers at context `ctx` (elements of `kv`), and the DeltaNet states read and written.
double decode_bytes(const Weights& w, double ctx, cpu::KvType kv) {
  const ModelSpec& s = w.spec();
  double bytes = static_cast<double>(w.bytes());
  if (!s.tied_embeddings) {
    const cpu::WeightView* e = w.find("token_embd");
    bytes -= static_cast<double>(*row_bytes(e->type, e->cols)) * (e->rows - 1);
  }
  bytes += static_cast<double>(s.n_attention_layers()) * 2.0 * s.kv_dim() * (kv == cpu::KvType::kF16 ? 2.0 : 4.0) * ctx;
  bytes += static_cast<double>(s.n_recurrent_layers()) * 2.0 * s.gdn.state_floats() * 4.0;
  return bytes;
}

// The op table of a ProfilingBackend after `steps` steps that took `wall` seconds: every op's share of a step
// beside the time its bytes would take at the measured copy rate ("lost" = the difference, what a faster op
// could save).
nlohmann::json profile_table(const ProfilingBackend& prof, int64_t steps, double wall, double bandwidth) {
  const double per = 1.0 / static_cast<double>(steps);
  double busy_us = 0, bytes = 0;
  nlohmann::json rows = nlohmann::json::array();
  for (const OpProfileRow& r : prof.report()) {
    const double us = r.ms * 1e3 * per, mb = r.bytes * per / 1e6, ideal_us = r.bytes * per / bandwidth * 1e6;
    busy_us += us;
    bytes += r.bytes * per;
    rows.push_back({{"op", r.op}, {"calls_per_step", r.calls * per}, {"us_per_step", us},
                    {"host_us_per_step", r.host_ms * 1e3 * per}, {"mb_per_step", mb},
                    {"gb_s", us > 0 ? mb * 1e6 / (us * 1e-6) / 1e9 : 0.0}, {"ideal_us", ideal_us},
                    {"lost_us", us - ideal_us}});
  }
  return nlohmann::json{{"steps", steps},       {"step_wall_us", wall * 1e6 * per}, {"ops_us", busy_us},
                        {"ideal_us", bytes / bandwidth * 1e6}, {"ops", rows}};
}

void print_profile(const nlohmann::json& p, const std::string& title) {
  const double wall_us = p["step_wall_us"].get<double>();
  std::printf("\n  %s profile (%lld steps; each op timed on the backend's timeline, marks add a little;\n"
              "  where the host enqueues slower than the device runs, an op's time is the host's):\n",
              title.c_str(), static_cast<long long>(p["steps"].get<int64_t>()));
  std::printf("  %-18s %7s %9s %6s %9s %9s %8s %9s %9s\n", "op", "calls", "us/step", "share", "host us", "MB/step",
              "GB/s", "ideal us", "lost us");
  for (const auto& r : p["ops"])
    std::printf("  %-18s %7.1f %9.1f %5.1f%% %9.1f %9.2f %8.0f %9.1f %9.1f\n", r["op"].get<std::string>().c_str(),
                r["calls_per_step"].get<double>(), r["us_per_step"].get<double>(),
                100.0 * r["us_per_step"].get<double>() / wall_us, r["host_us_per_step"].get<double>(),
                r["mb_per_step"].get<double>(), r["gb_s"].get<double>(), r["ideal_us"].get<double>(),
                r["lost_us"].get<double>());
  std::printf("  step wall %.1f us, ops %.1f us (%.0f%% of the step), bytes at the copy rate %.1f us\n", wall_us,
              p["ops_us"].get<double>(), 100.0 * p["ops_us"].get<double>() / wall_us, p["ideal_us"].get<double>());
}

// Runs `steps` more decode steps through a ProfilingBackend: profile_table of a decode step.
Result<nlohmann::json> profile_decode(const Weights& weights, Backend& be, SequenceState& state, int32_t token,
                                      int64_t steps, double bandwidth, bool print) {
  ProfilingBackend prof(be);
  Runner runner(weights, prof);
  double wall = 0;
  for (int64_t i = 0; i < steps; ++i) {
    Step step;
    step.tokens = std::span<const int32_t>(&token, 1);
    const double t0 = now_s();
    DF_ASSIGN_OR_RETURN(StepOutput o, runner.forward(state, step));
    DF_RETURN_IF_ERROR(prof.collect());
    wall += now_s() - t0;
    token = static_cast<int32_t>(std::max_element(o.logits.begin(), o.logits.end()) - o.logits.begin());
  }
  nlohmann::json table = profile_table(prof, steps, wall, bandwidth);
  if (print) print_profile(table, "decode step");
  return table;
}

// FLOPs of prefilling n tokens in steps of `chunk`: the layers' products (2 per weight element and token),
// attention (4 nh hd per visible (query, key) pair: scores and the weighted sum), the DeltaNet recurrence
// (about 6 nvh dk dv per token and layer: the state read, updated and applied; the chunked form's extra
// intra-chunk products are left out), and the head once per step (the last token's logits).
double prefill_flops(const Weights& w, int64_t n, int64_t chunk) {
  const ModelSpec& s = w.spec();
  const double tokens = static_cast<double>(n);
  double f = 2.0 * static_cast<double>(w.layer_matmul_elements()) * tokens;
  for (int64_t l = 0; l < s.n_layers; ++l) {
    if (s.is_recurrent(l)) {
      f += 6.0 * tokens * static_cast<double>(s.gdn.n_v_heads * s.gdn.d_k * s.gdn.d_v);
      continue;
    }
    const int64_t win = static_cast<size_t>(l) < s.sliding_window.size() ? s.sliding_window[static_cast<size_t>(l)] : 0;
    double visible = tokens * (tokens + 1) / 2;  // query i sees keys 0..i
    if (win > 0 && win < n) visible = static_cast<double>(win) * (win + 1) / 2 + static_cast<double>(n - win) * win;
    f += 4.0 * static_cast<double>(s.n_heads * s.head_dim) * visible;
  }
  f += 2.0 * static_cast<double>(s.vocab * s.hidden) * static_cast<double>((n + chunk - 1) / chunk);
  return f;
}

// One prefill of `prompt` on a fresh sequence through a ProfilingBackend: every op's share of it.
Result<nlohmann::json> profile_prefill(const Weights& weights, Backend& be, const Runner& runner,
                                       std::span<const int32_t> prompt, double bandwidth) {
  ProfilingBackend prof(be);
  Runner prof_runner(weights, prof);
  SequenceState state(weights.spec(), runner.state_layout());
  const double t0 = now_s();
  DF_RETURN_IF_ERROR(prof_runner.prefill(state, prompt, runner.prefill_chunk()).status());
  DF_RETURN_IF_ERROR(prof.collect());
  return profile_table(prof, 1, now_s() - t0, bandwidth);
}

// The shape of a verify step of n nodes: a chain (parents i - 1), or, for a tree, a DDTree-like one: a spine
// with one leaf beside each spine node past the root (node 2d - 1 the spine at depth d, node 2d a leaf at depth d,
// the children of node 2d - 3; so n = 23 is 11 deep). A tree's mask, per-node DeltaNet states and commit are what a
// DDTree verify runs; its cost barely depends on the exact shape.
struct VerifyShape {
  bool tree = false;  // a tree step (n > 1): kTree mask, per-node states, commit_tree; else a chain
  std::vector<int32_t> parents, depths;
  int32_t depth() const { return depths.empty() ? 0 : *std::max_element(depths.begin(), depths.end()); }
};
VerifyShape verify_shape(int64_t n, bool tree) {
  VerifyShape v;
  v.tree = tree && n > 1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t level = (i - 1) / 2;  // the depth of node i's parent (i >= 1)
    const int64_t parent = i == 0 ? -1 : !tree ? i - 1 : level == 0 ? 0 : 2 * level - 1;
    v.parents.push_back(static_cast<int32_t>(parent));
    v.depths.push_back(static_cast<int32_t>(i == 0 ? 0 : v.depths[static_cast<size_t>(parent)] + 1));
  }
  return v;
}

// One verify-shaped step of `tokens` through `runner` in `shape` (verify_shape of tokens.size()), then the
// rollback to one kept token, or a tree's commit of its root (timed apart into *rollback_ms when given: the
// DeltaNet layers re-run the kept token).
Status verify_shaped_step(Runner& runner, SequenceState& state, std::span<const int32_t> tokens,
                          const VerifyShape& shape, double* ms, double* rollback_ms = nullptr) {
  Backend& be = runner.backend();
  const auto n = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> top(tokens.size());
  std::vector<float> top_value(tokens.size());
  Step step;
  step.tokens = tokens;
  step.all_logits = true;
  step.logits_on_device = true;
  step.capture_recurrent = true;
  std::vector<int32_t> positions;
  if (shape.tree) {
    for (const int32_t d : shape.depths) positions.push_back(static_cast<int32_t>(state.n_past() + d));
    step.mask = cpu::MaskKind::kTree;
    step.parents = shape.parents;
    step.positions = positions;
  }
  const double t0 = now_s();
  DF_ASSIGN_OR_RETURN(StepOutput o, runner.forward(state, step));
  DF_RETURN_IF_ERROR(be.top_k_rows(o.device_logits.data(), n, runner.spec().vocab, 1, top.data(), top_value.data(),
                                   nullptr));
  DF_RETURN_IF_ERROR(be.synchronize());
  if (ms != nullptr) *ms = (now_s() - t0) * 1e3;
  const double t1 = now_s();
  const int32_t root = 0;
  if (shape.tree) DF_RETURN_IF_ERROR(state.commit_tree(shape.parents, std::span<const int32_t>(&root, 1)));
  else DF_RETURN_IF_ERROR(state.rollback_captured(1));
  if (rollback_ms == nullptr) return Status();
  DF_RETURN_IF_ERROR(be.synchronize());
  *rollback_ms = (now_s() - t1) * 1e3;
  return Status();
}

// Verify-shaped target steps (a chain of n tokens, or with `tree` a tree of n nodes: every row's logits left on
// the device and their argmax taken there, DeltaNet states captured, then rolled back to one kept token, as a
// DFlash step with no acceptance does) beside a plain one-token step, both at the sequence's current length: the
// cost of verifying n tokens in units of one decode step. Draft features are not captured (a few KB a step).
// With profile_steps > 0, also profiles that many verify steps of the last count op by op ("profile" of the
// last row).
Result<nlohmann::json> bench_verify_cost(const Weights& weights, Runner& runner, SequenceState& state,
                                         std::span<const int64_t> counts, bool tree, int32_t token,
                                         int64_t profile_steps, double bandwidth) {
  constexpr int kReps = 8;
  const auto plain_ms = [&]() -> Result<double> {
    std::vector<double> ms;
    for (int r = 0; r < kReps + 1; ++r) {
      Step step;
      step.tokens = std::span<const int32_t>(&token, 1);
      const double t0 = now_s();
      DF_RETURN_IF_ERROR(runner.forward(state, step).status());
      if (r > 0) ms.push_back((now_s() - t0) * 1e3);
    }
    return median(ms);
  };
  DF_ASSIGN_OR_RETURN(const double ar_ms, plain_ms());
  nlohmann::json rows = nlohmann::json::array();
  for (const int64_t n : counts) {
    if (n < 1) return invalid_argument("--verify-cost takes token counts >= 1, not {}", n);
    const int64_t max_ctx = runner.spec().max_context;
    if (max_ctx > 0 && state.n_past() + n + kReps + 1 > max_ctx)
      return invalid_argument("--verify-cost {}: past the model's context of {}", n, max_ctx);
    const std::vector<int32_t> tokens(static_cast<size_t>(n), token);
    const VerifyShape shape = verify_shape(n, tree);
    std::vector<double> ms, back_ms;
    for (int r = 0; r < kReps + 1; ++r) {
      double t = 0, b = 0;
      DF_RETURN_IF_ERROR(verify_shaped_step(runner, state, tokens, shape, &t, &b));
      if (r > 0) ms.push_back(t), back_ms.push_back(b);
    }
    const double v = median(ms);
    rows.push_back({{"tokens", n}, {"shape", tree ? "tree" : "chain"}, {"depth", shape.depth()}, {"verify_ms", v},
                    {"plain_ms", ar_ms}, {"ratio", v / ar_ms}, {"rollback_ms", median(back_ms)}});
  }
  if (profile_steps > 0 && !counts.empty()) {
    ProfilingBackend prof(runner.backend());
    Runner prof_runner(weights, prof);
    const std::vector<int32_t> tokens(static_cast<size_t>(counts.back()), token);
    const VerifyShape shape = verify_shape(counts.back(), tree);
    double wall = 0;
    for (int64_t i = 0; i < profile_steps; ++i) {
      const double t0 = now_s();
      DF_RETURN_IF_ERROR(verify_shaped_step(prof_runner, state, tokens, shape, nullptr));
      DF_RETURN_IF_ERROR(prof.collect());
      wall += now_s() - t0;
    }
    rows.back()["profile"] = profile_table(prof, profile_steps, wall, bandwidth);
  }
  return rows;
}

// Greedy decoding of a prompt with and without the draft (the decoder itself: no adaptive fallback, no stop
// at end-of-generation tokens): tokens per second of each, the speedup, the acceptance, and the acceptance
// length a step must reach to pay. Null when there is no draft.
Result<nlohmann::json> bench_speculative(const BenchOptions& opt, LoadedModel& model, std::span<const int32_t> ids_random,
                                         double bandwidth) {
  SpecOptions spec;
  DF_ASSIGN_OR_RETURN(std::unique_ptr<ResidentDraft> resident, load_draft(opt.draft, opt.model, model, opt.threads, &spec));
  if (resident == nullptr) return nlohmann::json();
  DF_ASSIGN_OR_RETURN(DFlashDraft * draft, resident->acquire());
  Runner& runner = *model.runner;
  draft->set_step_graphs(!opt.no_spec_graphs);
  const ModelSpec& s = model.weights().spec();
  std::vector<int32_t> prompt(ids_random.begin(), ids_random.end());
  if (!opt.prompt.empty()) {
    DF_ASSIGN_OR_RETURN(Tokenizer tok, load_tokenizer(opt.model));
    std::string text = opt.prompt;
    if (opt.chat) {
      DF_ASSIGN_OR_RETURN(ChatTemplateSource src, load_chat_template(opt.model));
      DF_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::create(src));
      nlohmann::ordered_json messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", text}}});
      DF_ASSIGN_OR_RETURN(text, tmpl.render(messages, nullptr, true, nlohmann::ordered_json{{"enable_thinking", false}}));
    }
    DF_ASSIGN_OR_RETURN(prompt, tok.encode(text, true));
  }
  if (s.max_context > 0 && static_cast<int64_t>(prompt.size()) + opt.gen_len + draft->block_size() > s.max_context)
    return invalid_argument("the prompt and --gen-len exceed the model's context of {}", s.max_context);
  // The speculative runs' choice at a verified node: its greedy token, with the sampler's errors.
  const ChooseFn choose = [](NodeLogits& l) -> Result<Choice> {
    DF_ASSIGN_OR_RETURN(const int32_t t, l.greedy());
    return Choice{t, false};
  };
  const auto greedy = [](std::span<const float> l) {
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  };
  // Plain: prefill, then one recorded decode step a token. Run twice, timing the second: the first loads kernels
  // and picks GEMM algorithms. Each run is a new sequence, so each records its own step graphs (recordings are
  // kept per sequence), on both sides of the comparison.
  std::vector<int32_t> plain;
  double plain_s = 0;
  for (int rep = 0; rep < 2; ++rep) {
    SequenceState st(s, runner.state_layout());
    DF_ASSIGN_OR_RETURN(std::vector<float> logits, runner.prefill(st, prompt));
    plain = {greedy(logits)};
    const double t0 = now_s();
    while (static_cast<int64_t>(plain.size()) < opt.gen_len) {
      Step step;
      step.tokens = std::span<const int32_t>(&plain.back(), 1);
      DF_ASSIGN_OR_RETURN(StepOutput o, runner.forward(st, step));
      plain.push_back(greedy(o.logits));
    }
    plain_s = now_s() - t0;
  }
  // Speculative: prefill with the draft's features captured, then draft + verify steps. Run twice too.
  std::vector<int32_t> got;
  SpecStats stats;
  double spec_s = 0;
  nlohmann::json graphs;  // the measured run's recorded steps
  for (int rep = 0; rep < 2; ++rep) {
    const int64_t replayed0 = runner.replayed_steps(), recordings0 = runner.recordings();
    SequenceState st(s, runner.state_layout());
    FeatureRing ring = feature_ring_for(*draft, runner, spec.feature_window);
    DFlashDraft::Context ctx(*draft);
    DF_ASSIGN_OR_RETURN(StepOutput o,
                        forward_capturing(runner, st, ring, draft->capture_layers(), prompt, runner.prefill_chunk()));
    got = {greedy(o.logits)};
    stats = SpecStats();
    const double t0 = now_s();
    while (static_cast<int64_t>(got.size()) < opt.gen_len) {
      const int64_t left = opt.gen_len - static_cast<int64_t>(got.size());
      DF_ASSIGN_OR_RETURN(SpecStepResult r, speculative_step(runner, st, ring, *draft, ctx, got.back(),
                                                             std::max<int64_t>(1, left), spec, choose, &stats));
      got.insert(got.end(), r.tokens.begin(), r.tokens.end());
    }
    spec_s = now_s() - t0;
    graphs = {{"target_replays", runner.replayed_steps() - replayed0},
              {"target_recordings", runner.recordings() - recordings0},
              {"draft_replays", ctx.replayed_steps()},
              {"draft_recordings", ctx.recordings()}};
  }
  got.resize(plain.size());
  // Then `--profile` speculative steps (draft + verify) through a ProfilingBackend, on a fresh sequence.
  nlohmann::json profile;
  if (opt.profile > 0) {
    ProfilingBackend prof(runner.backend());
    Runner prof_runner(model.weights(), prof);
    DF_ASSIGN_OR_RETURN(std::unique_ptr<DFlashDraft> prof_draft,
                        DFlashDraft::create(draft->weights(), model.weights(), prof));
    SequenceState st(s, runner.state_layout());
    FeatureRing ring = feature_ring_for(*prof_draft, runner, spec.feature_window);
    DFlashDraft::Context ctx(*prof_draft);
    DF_ASSIGN_OR_RETURN(StepOutput o,
                        forward_capturing(runner, st, ring, draft->capture_layers(), prompt, runner.prefill_chunk()));
    int32_t root = greedy(o.logits);
    double wall = 0;
    for (int64_t i = 0; i < opt.profile; ++i) {
      const double t0 = now_s();
      DF_ASSIGN_OR_RETURN(SpecStepResult r, speculative_step(prof_runner, st, ring, *prof_draft, ctx, root,
                                                             draft->block_size() - 1, spec, choose, nullptr));
      DF_RETURN_IF_ERROR(prof.collect());
      wall += now_s() - t0;
      root = r.tokens.back();
    }
    profile = profile_table(prof, opt.profile, wall, bandwidth);
  }
  resident->release();
  // Tokens after the first (decoded, not prefilled) per second.
  const double plain_tps = (opt.gen_len - 1) / std::max(plain_s, 1e-9);
  const double spec_tps = (opt.gen_len - 1) / std::max(spec_s, 1e-9);
  const double steps = static_cast<double>(std::max<int64_t>(stats.steps, 1));
  const double step_ms = (stats.draft_ms + stats.tree_ms + stats.verify_ms + stats.commit_ms) / steps;
  return nlohmann::json{{"draft", resident->path()},
                        {"mode", spec.ddtree ? "ddtree" : "chain"},
                        {"ddtree_budget", spec.ddtree_budget},
                        {"prompt_tokens", prompt.size()},
                        {"tokens", opt.gen_len},
                        {"plain_tok_s", plain_tps},
                        {"spec_tok_s", spec_tps},
                        {"speedup", spec_tps / std::max(plain_tps, 1e-9)},
                        {"same_text", got == plain},
                        {"steps", stats.steps},
                        {"drafted", stats.drafted},
                        {"accepted", stats.accepted},
                        {"acceptance_length", static_cast<double>(stats.accepted + stats.steps) / steps},
                        {"accepted_at", stats.accepted_at},
                        {"draft_ms_per_step", stats.draft_ms / steps},
                        {"tree_ms_per_step", stats.tree_ms / steps},
                        {"verify_ms_per_step", stats.verify_ms / steps},
                        {"commit_ms_per_step", stats.commit_ms / steps},
                        // The acceptance length at which a step (draft, tree, verify, commit) costs what as many plain
                        // tokens do.
                        {"break_even_tau", step_ms / (1e3 / std::max(plain_tps, 1e-9))},
                        {"graphs", graphs},
                        {"profile", profile}};
}

Status run_bench(const BenchOptions& opt) {
  if (opt.prompt_len < 1 || opt.gen_len < 1) return invalid_argument("--prompt-len and --gen-len must be >= 1");
  if (opt.profile < 0) return invalid_argument("--profile takes a number of decode steps >= 0");
  if (opt.reps < 1) return invalid_argument("--reps takes a number of prefill runs >= 1");
  if (opt.verify_tree && opt.verify_cost.empty()) return invalid_argument("--verify-tree needs --verify-cost");
  DF_ASSIGN_OR_RETURN(LoadedModel model, load_model(opt.model, opt.where, opt.threads));
  if (model.split() && (opt.profile > 0 || opt.profile_prefill))
    return invalid_argument("--profile and --profile-prefill need a target on one device");
  const Weights& weights = model.weights();
  const ModelSpec& s = weights.spec();
  if (s.max_context > 0 && opt.prompt_len + opt.gen_len + opt.profile > s.max_context)
    return invalid_argument("{} + {} tokens exceed the model's context of {}", opt.prompt_len, opt.gen_len, s.max_context);
  Runner& runner = *model.runner;
  runner.set_verify_graphs(!opt.no_spec_graphs);
  ThreadPool copy_pool(opt.threads);
  const bool on_cpu = model.device_name() == "cpu";
  DF_ASSIGN_OR_RETURN(const double bandwidth,
                      on_cpu ? Result<double>(measure_host_bandwidth(copy_pool)) : measure_device_bandwidth(runner.backend()));

  // Prompt ids: a fixed pseudo-random sequence (speed does not depend on the text).
  std::vector<int32_t> prompt(static_cast<size_t>(opt.prompt_len));
  uint64_t x = 88172645463325252ull;
  for (auto& t : prompt) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = static_cast<int32_t>(x % static_cast<uint64_t>(s.vocab));
  }
  // Prefill `reps` times, each on a fresh sequence: the first run is cold (kernels loaded, heuristics picked,
  // scratch grown: what a first request sees, its TTFT); the prefill rate is the median of the others.
  std::optional<SequenceState> kept;  // the last run's sequence, which decode continues
  std::vector<int32_t> tokens;
  double ttft_s = 0;
  std::vector<double> warm_s;
  for (int rep = 0; rep < opt.reps; ++rep) {
    kept.reset();  // the previous run's memory back before the next one takes its own
    kept.emplace(s, runner.state_layout());
    const double t0 = now_s();
    DF_ASSIGN_OR_RETURN(std::vector<float> logits, runner.prefill(*kept, prompt));
    tokens = {static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())};
    const double took = now_s() - t0;
    if (rep == 0) ttft_s = took;
    else warm_s.push_back(took);
  }
  SequenceState& state = *kept;
  const double prefill_s = warm_s.empty() ? ttft_s : median(warm_s);
  const HandoffStats h0 = runner.handoff_stats();
  // The decode rate is the steady state's: the steps after the first, which on a device records the step's graph
  // (once a sequence: a server slot keeps its recordings across requests) and is reported apart, as the peer's
  // warm-up steps are (llbench --tgwarm). With --gen-len 1 the one step is all there is. Each token is the
  // argmax reduced on the backend, as the server's plain greedy decoding takes it (Runner::greedy_token).
  const double t1 = now_s();
  double t_steady = t1;
  for (int64_t i = 0; i < opt.gen_len; ++i) {
    Step step;
    step.tokens = std::span<const int32_t>(&tokens.back(), 1);
    step.logits_on_device = true;
    DF_ASSIGN_OR_RETURN(StepOutput o, runner.forward(state, step));
    DF_ASSIGN_OR_RETURN(const int32_t next, runner.greedy_token(o));
    tokens.push_back(next);
    if (i == 0) t_steady = now_s();
  }
  const double t_end = now_s();
  const double first_step_s = t_steady - t1;
  const int64_t steady_steps = opt.gen_len > 1 ? opt.gen_len - 1 : 1;
  const double decode_s = opt.gen_len > 1 ? t_end - t_steady : t_end - t1;
  const HandoffStats h1 = runner.handoff_stats();
  const double handoff_ms_per_token = (h1.ms - h0.ms) / static_cast<double>(opt.gen_len);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const MemoryStats mem = runner.backend().memory_stats();
  constexpr double kMiB = 1048576.0;

  const double prefill_tps = opt.prompt_len / prefill_s, decode_tps = static_cast<double>(steady_steps) / decode_s;
  // Prefill's ceiling: its FLOPs at the device's measured dense bf16 rate (none on the CPU).
  const double flops = prefill_flops(weights, opt.prompt_len, runner.prefill_chunk());
  nlohmann::json peak_tflops, prefill_ceiling, prefill_ratio;
  if (!on_cpu && !model.split()) {
    if (auto peak = runner.backend().measure_peak_matmul_flops(); peak.ok()) {
      peak_tflops = *peak / 1e12;
      prefill_ceiling = *peak / flops * static_cast<double>(opt.prompt_len);
      prefill_ratio = prefill_tps / prefill_ceiling.get<double>();
    } else {
      log::warn("bench: {}", peak.status().to_string());
    }
  }
  const double bytes = decode_bytes(*model.host, opt.prompt_len + opt.gen_len / 2.0, runner.backend().kv_type());
  const double decode_ceiling = bandwidth / bytes;
  nlohmann::json j = {{"backend", model.placement_name()},
                      {"handoffs_per_token", static_cast<double>(h1.count - h0.count) / static_cast<double>(opt.gen_len)},
                      {"handoff_ms_per_token", handoff_ms_per_token},
                      {"threads", copy_pool.size()},
                      {"model", s.summary()},
                      {"weights_mib", model.host->bytes() / 1048576.0},
                      {"prompt_len", opt.prompt_len},
                      {"gen_len", opt.gen_len},
                      {"prefill_tok_s", prefill_tps},
                      {"prefill_reps", opt.reps},
                      {"prefill_cold_tok_s", opt.prompt_len / ttft_s},
                      {"prefill_tflop", flops / 1e12},
                      {"peak_matmul_tflop_s", peak_tflops},
                      {"prefill_ceiling_tok_s", prefill_ceiling},
                      {"prefill_ratio", prefill_ratio},
                      {"ttft_ms", ttft_s * 1e3},
                      {"decode_tok_s", decode_tps},
                      {"decode_first_step_ms", first_step_s * 1e3},
                      {"decode_bytes_per_token", bytes},
                      {"host_bandwidth_gb_s", bandwidth / 1e9},
                      {"decode_ceiling_tok_s", decode_ceiling},
                      {"decode_ratio", decode_tps / decode_ceiling},
                      {"decode_steps_replayed", runner.replayed_steps()},
                      {"peak_rss_mib", ru.ru_maxrss / 1024.0},
                      {"memory_mib",
                       {{"weights", weights.bytes() / kMiB},
                        {"sequence_state", state.bytes() / kMiB},
                        {"buffers_live", mem.buffers_live / kMiB},
                        {"buffers_peak", mem.buffers_peak / kMiB},
                        {"buffers_cached", mem.buffers_cached / kMiB},
                        {"scratch", mem.scratch / kMiB},
                        {"device_used", mem.device_used / kMiB},
                        {"device_total", mem.device_total / kMiB}}}};
  if (!opt.verify_cost.empty()) {
    DF_ASSIGN_OR_RETURN(j["verify_cost"], bench_verify_cost(weights, runner, state, opt.verify_cost, opt.verify_tree,
                                                            tokens.back(), opt.profile, bandwidth));
  }
  if (opt.profile_prefill) {
    DF_ASSIGN_OR_RETURN(j["prefill_profile"], profile_prefill(weights, runner.backend(), runner, prompt, bandwidth));
  }
  DF_ASSIGN_OR_RETURN(nlohmann::json spec_j, bench_speculative(opt, model, prompt, bandwidth));
  if (!spec_j.is_null()) j["speculative"] = spec_j;
  if (opt.json) {
    if (opt.profile > 0) {
      DF_ASSIGN_OR_RETURN(j["profile"], profile_decode(weights, runner.backend(), state, tokens.back(), opt.profile,
                                                       bandwidth, false));
    }
    std::printf("%s\n", j.dump(2).c_str());
    return Status();
  }
  std::printf("dflash bench (%s, %d cpu threads): %s, %.1f MiB of weights\n", model.placement_name().c_str(),
              copy_pool.size(), s.summary().c_str(), model.host->bytes() / 1048576.0);
  if (model.split())
    std::printf("  layer split: %lld hand-offs a decode step, %.3f ms a token\n",
                static_cast<long long>((h1.count - h0.count) / opt.gen_len), handoff_ms_per_token);
  std::printf("  %-8s %12s %22s %8s\n", "", "measured", "ceiling", "ratio");
  if (prefill_ceiling.is_null())
    std::printf("  %-8s %8.1f tok/s %22s %8s   (%lld tokens, %s; cold run %.1f tok/s, TTFT %.1f ms)\n", "prefill",
                prefill_tps, on_cpu ? "n/a on cpu" : "n/a", "", static_cast<long long>(opt.prompt_len),
                warm_s.empty() ? "one cold run" : "median of the warm runs", opt.prompt_len / ttft_s, ttft_s * 1e3);
  else
    std::printf("  %-8s %8.1f tok/s %8.1f tok/s      %6.2f   (%lld tokens, %.2f TFLOP at %.0f TFLOP/s bf16; %s; cold "
                "run %.1f tok/s, TTFT %.1f ms)\n",
                "prefill", prefill_tps, prefill_ceiling.get<double>(), prefill_ratio.get<double>(),
                static_cast<long long>(opt.prompt_len), flops / 1e12, peak_tflops.get<double>(),
                warm_s.empty() ? "one cold run" : "median of the warm runs", opt.prompt_len / ttft_s, ttft_s * 1e3);
  const std::string steps_note =
      opt.gen_len > 1 ? fmt::format("{} steps after the first, which took {:.2f} ms", steady_steps, first_step_s * 1e3)
                      : std::string("one step");
  std::printf("  %-8s %8.2f tok/s %8.2f tok/s      %6.2f   (%.1f MB/token at %.2f GB/s copy rate; %s)\n", "decode",
              decode_tps, decode_ceiling, decode_tps / decode_ceiling, bytes / 1e6, bandwidth / 1e9, steps_note.c_str());
  std::printf("  peak RSS %.1f MiB; %lld of %lld decode steps replayed from a recorded graph\n", ru.ru_maxrss / 1024.0,
              static_cast<long long>(runner.replayed_steps()), static_cast<long long>(opt.gen_len));
  std::printf("  memory (%s): weights %.1f MiB, sequence state %.1f MiB (KV, DeltaNet), buffers live %.1f MiB "
              "(peak %.1f, cached %.1f), scratch %.1f MiB",
              model.device_name().c_str(), weights.bytes() / kMiB, state.bytes() / kMiB, mem.buffers_live / kMiB,
              mem.buffers_peak / kMiB, mem.buffers_cached / kMiB, mem.scratch / kMiB);
  if (mem.device_total > 0)
    std::printf("; device %.0f of %.0f MiB in use", mem.device_used / kMiB, mem.device_total / kMiB);
  std::printf("\n");
  for (const auto& v : j.value("verify_cost", nlohmann::json::array())) {
    const bool tree = v.value("shape", "chain") == "tree";
    std::printf("  verify step of %lld tokens%s: %.2f ms = %.2fx a plain step (%.2f ms); %s %.2f ms\n",
                static_cast<long long>(v["tokens"].get<int64_t>()),
                tree ? (" (tree, " + std::to_string(v["depth"].get<int64_t>()) + " deep)").c_str() : "",
                v["verify_ms"].get<double>(), v["ratio"].get<double>(), v["plain_ms"].get<double>(),
                tree ? "commit of the root alone" : "rollback to one kept token", v.value("rollback_ms", 0.0));
  }
  for (const auto& v : j.value("verify_cost", nlohmann::json::array()))
    if (v.contains("profile"))
      print_profile(v["profile"], "verify step of " + std::to_string(v["tokens"].get<int64_t>()) + " tokens");
  if (j.contains("prefill_profile")) print_profile(j["prefill_profile"], "prefill (one run of the prompt)");
  if (!spec_j.is_null()) {
    const auto& sj = spec_j;
    std::printf("  speculative (%s, %s; greedy, %lld-token prompt): plain %.1f tok/s, with the draft %.1f tok/s "
                "(%.2fx), same tokens: %s\n    acceptance length %.2f over %lld steps (drafted %lld, accepted %lld); "
                "draft %.3f + tree %.3f + verify %.3f + commit %.3f ms per step: it pays above an acceptance length of "
                "%.2f\n",
                sj["mode"].get<std::string>().c_str(), sj["draft"].get<std::string>().c_str(),
                static_cast<long long>(sj["prompt_tokens"].get<size_t>()), sj["plain_tok_s"].get<double>(),
                sj["spec_tok_s"].get<double>(), sj["speedup"].get<double>(), sj["same_text"].get<bool>() ? "yes" : "NO",
                sj["acceptance_length"].get<double>(), static_cast<long long>(sj["steps"].get<int64_t>()),
                static_cast<long long>(sj["drafted"].get<int64_t>()), static_cast<long long>(sj["accepted"].get<int64_t>()),
                sj["draft_ms_per_step"].get<double>(), sj["tree_ms_per_step"].get<double>(),
                sj["verify_ms_per_step"].get<double>(), sj["commit_ms_per_step"].get<double>(),
                sj["break_even_tau"].get<double>());
    if (!sj["profile"].is_null())
      print_profile(sj["profile"], std::string("speculative step (draft + ") + sj["mode"].get<std::string>() + " verify)");
  }
  if (opt.profile > 0) {
    DF_RETURN_IF_ERROR(
        profile_decode(weights, runner.backend(), state, tokens.back(), opt.profile, bandwidth, true).status());
  }
  return Status();
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "Benchmark prefill/decode against their ceilings, or write random models");
  std::string shapes;
  for (auto n : random_model_presets()) shapes += (shapes.empty() ? "" : ", ") + std::string(n);
  cmd->add_option("--make-random", opt->make_random, "Write a random-weight GGUF of this shape: " + shapes);
  cmd->add_option("--type", opt->type, "File type of --make-random (llama.cpp's mix: f32, bf16, q8_0, q4_k_m, ...)")
      ->capture_default_str();
  cmd->add_option("-o,--out", opt->out, "Output file of --make-random");
  cmd->add_option("--tokenizer", opt->tokenizer, "Vocabulary for --make-random (GGUF or HF dir); default none");
  cmd->add_option("--seed", opt->seed, "Seed of the random weights")->capture_default_str();
  cmd->add_option("--distinct-rows", opt->distinct_rows,
                  "--make-random: generate N rows a tensor and repeat them (a 27B shape in seconds; speed figures "
                  "do not depend on the values, acceptance figures do); default 0, every row")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--model,-m", opt->model, "Model to benchmark (GGUF file or HF directory)");
  cmd->add_option("--prompt-len", opt->prompt_len, "Prompt tokens")->capture_default_str();
  cmd->add_option("--gen-len", opt->gen_len, "Generated tokens")->capture_default_str();
  cmd->add_option("--threads,-t", opt->threads, "CPU threads (default: all cores)");
  add_placement_flags(cmd, &opt->where);
  cmd->add_option("--profile", opt->profile, "Then profile this many decode steps per op (time, bytes, GB/s); with --verify-cost also as many verify steps of its last count")
      ->capture_default_str();
  cmd->add_option("--reps", opt->reps, "Prefill runs: the first is cold (TTFT), the rate is the others' median")
      ->capture_default_str();
  cmd->add_flag("--profile-prefill", opt->profile_prefill, "Then profile one prefill of the prompt per op");
  cmd->add_option("--verify-cost", opt->verify_cost,
                  "Time verify-shaped steps of these token counts (e.g. 16,23) beside a plain step, and the "
                  "rollback to one kept token after each")
      ->delimiter(',');
  cmd->add_flag("--verify-tree", opt->verify_tree,
                "With --verify-cost: tree-shaped steps, as DDTree verifies (tree mask, every node's DeltaNet state "
                "kept; a spine with a leaf beside each node: 23 nodes are 11 deep), committing the root alone");
  cmd->add_flag("--json", opt->json, "Machine-readable output");
  cmd->add_option("--prompt", opt->prompt, "With a draft: the prompt of the speculative run (default: --prompt-len random ids)");
  cmd->add_flag("--chat", opt->chat, "With --prompt: wrap it in the model's chat template");
  cmd->add_flag("--no-spec-graphs", opt->no_spec_graphs,
                "Run draft and verify steps (--draft, --verify-cost) eagerly, op by op (plain decode steps stay recorded)");
  add_draft_options(cmd, opt->draft);
  cmd->callback([opt, &exit_code] {
    Status st;
    if (!opt->make_random.empty()) st = make_random(*opt);
    else if (!opt->model.empty()) st = run_bench(*opt);
    else st = invalid_argument("give --model M to benchmark, or --make-random SHAPE -o FILE");
    exit_code = st.ok() ? 0 : report(st);
  });
}

}  // namespace dflash::cli
