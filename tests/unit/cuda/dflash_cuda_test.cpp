// DFlash on the CUDA backend against the CPU backend: the draft's forward (context K/V appended step by
// step, bidirectional block attention, the target's head), a DDTree verify with its commit (KV compaction,
// DeltaNet state of the deepest accepted node), and whole speculative decoding equal to plain greedy
// decoding on the device. Random qwen35 target and draft with 64-wide heads (the CUDA attention kernels
// take head dims 64, 128 and 256).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "decode/dflash.h"
#include "decode/runner.h"
#include "formats/safetensors.h"
#include "model/weights.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/cuda_backend.h"
#include "state/feature_ring.h"
#include "state/sequence_state.h"
#include "support/cuda_test_util.h"
#include "support/random_hf_model.h"
#include "support/test_paths.h"
#include "unit/ops/ops_test_util.h"

namespace dflash {
namespace {

double rel_err(std::span<const float> a, std::span<const float> b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return err / scale;
}

int32_t argmax(std::span<const float> x) {
  return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
}

nlohmann::json draft_config(int64_t hidden, int64_t vocab) {
  return {{"architectures", {"DFlashDraftModel"}},
          {"model_type", "qwen3"},
          {"hidden_size", hidden},
          {"intermediate_size", 128},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"head_dim", 64},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1e7},
          {"max_position_embeddings", 4096},
          {"vocab_size", vocab},
          {"block_size", 8},
          {"num_target_layers", 8},
          {"tie_word_embeddings", false},
          {"layer_types", {"full_attention", "full_attention"}},
          {"dflash_config", {{"mask_token_id", vocab - 1}, {"target_layer_ids", {1, 5}}}}};
}

// n verify nodes: random tokens of the 500 first ids, and a chain, or a random tree (a third of the nodes
// hang off a random earlier node) with each node's depth.
struct Nodes {
  std::vector<int32_t> tokens, parents, depth, positions;
  // The verify step over the nodes after n_past tokens (positions n_past + depth, held here): a chain causal, a
  // tree with its ancestor mask; every row's logits, recurrent state captured.
  Step verify_step(bool chain, int64_t n_past) {
    positions.resize(depth.size());
    for (size_t i = 0; i < depth.size(); ++i) positions[i] = static_cast<int32_t>(n_past + depth[i]);
    Step step;
    step.tokens = tokens;
    step.all_logits = true;
    step.capture_recurrent = true;
    if (!chain) {
      step.positions = positions;
      step.mask = cpu::MaskKind::kTree;
      step.parents = parents;
    }
    return step;
  }
};
Nodes random_nodes(std::mt19937& rng, int64_t n, bool chain) {
  Nodes t{std::vector<int32_t>(static_cast<size_t>(n)), std::vector<int32_t>(static_cast<size_t>(n)),
          std::vector<int32_t>(static_cast<size_t>(n)), {}};
  for (int64_t i = 0; i < n; ++i) {
    t.tokens[i] = static_cast<int32_t>(rng() % 500);
    t.parents[i] = i == 0 ? -1 : chain || rng() % 3 != 0 ? static_cast<int32_t>(i - 1)
                                                        : static_cast<int32_t>(rng() % static_cast<uint32_t>(i));
    t.depth[i] = i == 0 ? 0 : t.depth[t.parents[i]] + 1;
  }
  return t;
}

// One model on both backends.
struct Both {
  std::unique_ptr<Weights> host, dev;
};

class CudaDFlash : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
    nlohmann::json cfg = test::tiny_qwen35_config(512);
    cfg["head_dim"] = 64;
    cfg["rope_parameters"]["mrope_section"] = {4, 2, 2};
    const std::string tdir = test::scratch_dir() + "/target", ddir = test::scratch_dir() + "/draft";
    ASSERT_TRUE(test::write_random_hf_model(tdir, cfg, 23, target_dtype()).ok());
    ASSERT_TRUE(test::write_random_hf_model(ddir, draft_config(cfg["hidden_size"].get<int64_t>(), 512), 29,
                                            SafetensorsDType::kF32).ok());
    auto be = CudaBackend::create(0);
    ASSERT_TRUE(be.ok()) << be.status().to_string();
    be_ = std::move(be).value();
    // Prefills and draft context rows of more than 16 tokens would otherwise run the bf16 tensor-core GEMM, and a
    // random qwen35's logits are a chaotic function of their inputs (model_cuda_test.cpp): compare at f32.
    be_->set_tensor_core_prefill(false);
    load(tdir, target_);
    load(ddir, draft_);
    gpu_ = std::make_unique<Runner>(*target_.dev, *be_);
    cpu_ = std::make_unique<Runner>(*target_.host, 2);
    auto gd = DFlashDraft::create(*draft_.dev, *target_.dev, *be_);
    ASSERT_TRUE(gd.ok()) << gd.status().to_string();
    gpu_draft_ = std::move(gd).value();
    auto cd = DFlashDraft::create(*draft_.host, *target_.host, cpu_->backend());
    ASSERT_TRUE(cd.ok()) << cd.status().to_string();
    cpu_draft_ = std::move(cd).value();
    for (int i = 0; i < 40; ++i) prompt_.push_back((i * 37 + 3) % 500);
  }

  // The target checkpoint's weight type (the draft's stays float32).
  virtual SafetensorsDType target_dtype() const { return SafetensorsDType::kF32; }

  void load(const std::string& dir, Both& m) {
    auto host = Weights::load(dir, 2);
    ASSERT_TRUE(host.ok()) << host.status().to_string();
    m.host = std::make_unique<Weights>(std::move(host).value());
    auto dev = m.host->to_backend(*be_);
    ASSERT_TRUE(dev.ok()) << dev.status().to_string();
    m.dev = std::make_unique<Weights>(std::move(dev).value());
  }

  // Prefills `tokens` with the draft's capture layers into `ring`; the last logits.
  std::vector<float> prefill(Runner& r, SequenceState& st, FeatureRing& ring, std::span<const int32_t> tokens) {
    auto o = forward_capturing(r, st, ring, gpu_draft_->capture_layers(), tokens);
    EXPECT_TRUE(o.ok()) << o.status().to_string();
    return o.ok() ? o->logits : std::vector<float>{};
  }

  void speculative_greedy_equals_plain_greedy();
  void verify_logits_equal_plain_decoding();

  std::unique_ptr<CudaBackend> be_;  // declared first: destroyed last
  Both target_, draft_;
  std::unique_ptr<Runner> gpu_, cpu_;
  std::unique_ptr<DFlashDraft> gpu_draft_, cpu_draft_;
  std::vector<int32_t> prompt_;
};

TEST_F(CudaDFlash, draft_forward_matches_the_cpu) {
  SequenceState gs(target_.dev->spec(), *be_), cs(target_.host->spec(), cpu_->backend());
  FeatureRing gring(gpu_draft_->feature_width(), 4096), cring(cpu_draft_->feature_width(), 4096);
  prefill(*gpu_, gs, gring, std::span<const int32_t>(prompt_).first(30));
  prefill(*cpu_, cs, cring, std::span<const int32_t>(prompt_).first(30));
  DFlashDraft::Context gctx(*gpu_draft_), cctx(*cpu_draft_);
  // Two calls: the second appends only the 6 new context rows to the draft's K/V.
  for (int call = 0; call < 2; ++call) {
    if (call == 1) {
      prefill(*gpu_, gs, gring, std::span<const int32_t>(prompt_).subspan(30, 6));
      prefill(*cpu_, cs, cring, std::span<const int32_t>(prompt_).subspan(30, 6));
    }
    auto g = gpu_draft_->propose(gctx, gring, prompt_[36], 7, 8);
    auto c = cpu_draft_->propose(cctx, cring, prompt_[36], 7, 8);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    // The top-8 candidates of every drafted position and their log-probabilities.
    const double err = rel_err(g->logprobs, c->logprobs);
    std::printf("draft call %d: top-8 log-probs max rel err vs cpu %.3g\n", call, err);
    EXPECT_LT(err, 1e-3);
    EXPECT_EQ(g->tokens, c->tokens);
  }
}

TEST_F(CudaDFlash, tree_verify_and_commit_match_the_cpu) {
  const int64_t V = 512;
  SequenceState gs(target_.dev->spec(), *be_), cs(target_.host->spec(), cpu_->backend());
  FeatureRing gring(gpu_draft_->feature_width(), 4096), cring(cpu_draft_->feature_width(), 4096);
  const std::vector<float> last = prefill(*cpu_, cs, cring, prompt_);
  prefill(*gpu_, gs, gring, prompt_);
  // A tree whose greedy path goes through second children: the CPU's own continuation decides the tokens.
  const int32_t root = argmax(last);
  std::vector<int32_t> truth;
  {
    SequenceState ref(target_.host->spec(), cpu_->backend());
    auto l = cpu_->prefill(ref, prompt_);
    ASSERT_TRUE(l.ok());
    int32_t t = root;
    for (int i = 0; i < 4; ++i) {
      Step step;
      step.tokens = std::span<const int32_t>(&t, 1);
      auto o = cpu_->forward(ref, step);
      ASSERT_TRUE(o.ok());
      t = argmax(o->logits);
      truth.push_back(t);
    }
  }
  DraftTree tree = DraftTree::with_root(root);
  int32_t parent = 0;
  for (int32_t t : truth) {
    ASSERT_TRUE(tree.add_child(parent, (t + 1) % 500).ok());  // a wrong first child
    auto right = tree.add_child(parent, t);
    ASSERT_TRUE(right.ok());
    parent = *right;
  }
  const ChooseFn greedy = [](NodeLogits& logits) -> Result<Choice> { return Choice{logits.argmax(), false}; };
  auto g = verify_tree(*gpu_, gs, gring, gpu_draft_->capture_layers(), tree, greedy, nullptr);
  auto c = verify_tree(*cpu_, cs, cring, cpu_draft_->capture_layers(), tree, greedy, nullptr);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(g->tokens, c->tokens);
  ASSERT_EQ(c->tokens.size(), truth.size() + 1);  // every true token accepted, then the bonus
  EXPECT_EQ(gs.n_past(), cs.n_past());
  // Decoding on from the committed state agrees.
  int32_t t = c->tokens.back();
  for (int i = 0; i < 4; ++i) {
    Step step;
    step.tokens = std::span<const int32_t>(&t, 1);
    auto go = gpu_->forward(gs, step);
    auto co = cpu_->forward(cs, step);
    ASSERT_TRUE(go.ok() && co.ok());
    const double err = rel_err(go->logits, co->logits);
    EXPECT_LT(err, 1e-3) << "step " << i;
    EXPECT_EQ(argmax(go->logits), argmax(co->logits)) << "step " << i;
    t = argmax(co->logits);
  }
  (void)V;
}

// On float32 and on fp16 KV stores (the GPU's default, --kv-type auto; decode attention on the tensor cores).
TEST_F(CudaDFlash, speculative_greedy_equals_plain_greedy_on_the_device) {
  for (const cpu::KvType kv : {cpu::KvType::kF32, cpu::KvType::kF16}) {
    SCOPED_TRACE(cpu::kv_type_name(kv));
    be_->set_kv_type(kv);
    speculative_greedy_equals_plain_greedy();
    if (HasFatalFailure()) return;
  }
}

void CudaDFlash::speculative_greedy_equals_plain_greedy() {
  const int64_t n_gen = 32;
  // Plain greedy on the device (recorded decode steps).
  std::vector<int32_t> plain;
  {
    SequenceState st(target_.dev->spec(), *be_);
    auto l = gpu_->prefill(st, prompt_);
    ASSERT_TRUE(l.ok());
    int32_t t = argmax(*l);
    plain.push_back(t);
    while (static_cast<int64_t>(plain.size()) < n_gen) {
      Step step;
      step.tokens = std::span<const int32_t>(&t, 1);
      auto o = gpu_->forward(st, step);
      ASSERT_TRUE(o.ok());
      t = argmax(o->logits);
      plain.push_back(t);
    }
  }
  // A ring on the host, and the device ring the server and bench take (features never leave the GPU).
  for (const bool on_device : {false, true})
  for (bool ddtree : {false, true}) {
    SequenceState st(target_.dev->spec(), *be_);
    FeatureRing ring = on_device ? feature_ring_for(*gpu_draft_, *gpu_, 4096)
                                 : FeatureRing(gpu_draft_->feature_width(), 4096);
    ASSERT_EQ(ring.device() != nullptr, on_device);
    const std::vector<float> l = prefill(*gpu_, st, ring, prompt_);
    std::vector<int32_t> got = {argmax(l)};
    DFlashDraft::Context ctx(*gpu_draft_);
    SpecOptions opts;
    opts.ddtree = ddtree;
    opts.ddtree_budget = 12;
    SpecStats stats;
    const ChooseFn greedy = [](NodeLogits& logits) -> Result<Choice> { return Choice{logits.argmax(), false}; };
    while (static_cast<int64_t>(got.size()) < n_gen) {
      auto r = speculative_step(*gpu_, st, ring, *gpu_draft_, ctx, got.back(), 7, opts, greedy, &stats);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      got.insert(got.end(), r->tokens.begin(), r->tokens.end());
    }
    got.resize(static_cast<size_t>(n_gen));
    std::printf("%s: %lld steps, drafted %lld, accepted %lld\n", ddtree ? "ddtree" : "chain",
                static_cast<long long>(stats.steps), static_cast<long long>(stats.drafted),
                static_cast<long long>(stats.accepted));
    EXPECT_EQ(got, plain) << (ddtree ? "ddtree" : "chain") << (on_device ? ", device ring" : ", host ring");
  }
}

// Every node of a verify step -- a chain, and trees of 23, 41 and 100 nodes -- gets the logits plain decoding
// of its path gets (recorded decode steps), bit for bit: greedy and sampled DFlash output is plain
// decoding's on the device too, whichever node a walk reaches. On float32 and on fp16 KV stores (the float32
// and the tensor-core path kernels).
TEST_F(CudaDFlash, verify_logits_equal_plain_decoding_of_each_path_bit_for_bit) {
  for (const cpu::KvType kv : {cpu::KvType::kF32, cpu::KvType::kF16}) {
    SCOPED_TRACE(cpu::kv_type_name(kv));
    be_->set_kv_type(kv);
    verify_logits_equal_plain_decoding();
    if (HasFatalFailure()) return;
  }
}

void CudaDFlash::verify_logits_equal_plain_decoding() {
  const int64_t V = 512;
  std::mt19937 rng(11);
  for (int64_t n : {17, 23, 41, 100}) {
    const bool chain = n == 17;
    Nodes nodes = random_nodes(rng, n, chain);
    const auto& [tokens, parents, depth, positions] = nodes;
    SequenceState st(target_.dev->spec(), *be_);
    ASSERT_TRUE(gpu_->prefill(st, prompt_).ok());
    const Step step = nodes.verify_step(chain, st.n_past());
    auto verify = gpu_->forward(st, step);
    ASSERT_TRUE(verify.ok()) << verify.status().to_string();
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int32_t> path;
      for (int64_t a = i; a >= 0; a = parents[a]) path.insert(path.begin(), tokens[a]);
      SequenceState ref(target_.dev->spec(), *be_);
      ASSERT_TRUE(gpu_->prefill(ref, prompt_).ok());
      std::vector<float> logits;
      for (int32_t t : path) {
        Step one;
        one.tokens = std::span<const int32_t>(&t, 1);
        auto o = gpu_->forward(ref, one);
        ASSERT_TRUE(o.ok()) << o.status().to_string();
        logits = std::move(o->logits);
      }
      const float* row = verify->logits.data() + i * V;
      if (std::memcmp(logits.data(), row, sizeof(float) * V) != 0 && bad++ < 3)
        ADD_FAILURE() << (chain ? "chain" : "tree") << " of " << n << ": node " << i << " (depth " << depth[i]
                      << ") differs from plain decoding by up to "
                      << rel_err(std::span<const float>(row, V), logits) << " (relative)";
    }
    EXPECT_EQ(bad, 0) << bad << " of " << n << " nodes differ (" << (chain ? "chain" : "tree") << ")";
  }
}

// A bf16 target: its verify steps run the tensor-core GEMV (x rounded to bf16), and so do its plain steps once a
// draft decodes with it (Runner::set_exact_decode, as cli/draft_loader.cpp turns on). Verify rows equal plain
// decoding's bit for bit, and speculative greedy output equals plain greedy output.
class CudaDFlashBf16 : public CudaDFlash {
 protected:
  SafetensorsDType target_dtype() const override { return SafetensorsDType::kBF16; }
  void SetUp() override {
    CudaDFlash::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    const cpu::WeightView* down = target_.dev->find("layers.0.ffn.down");
    ASSERT_NE(down, nullptr);
    ASSERT_EQ(down->type, DType::kBF16);
    gpu_->set_exact_decode(true);
  }
};

TEST_F(CudaDFlashBf16, verify_logits_equal_plain_decoding_of_each_path_bit_for_bit) {
  be_->set_kv_type(cpu::KvType::kF16);
  verify_logits_equal_plain_decoding();
}

TEST_F(CudaDFlashBf16, speculative_greedy_equals_plain_greedy_on_the_device) {
  be_->set_kv_type(cpu::KvType::kF16);
  speculative_greedy_equals_plain_greedy();
}

// Plain decode steps that capture the draft's layers (a drafting request's fallback) are recorded and
// replayed like any decode step: their logits and features equal the eager step's bit for bit. Mode 2 also
// leaves the logits on the device (plain greedy decoding) and takes each token from Runner::greedy_token: the
// same rows, and the token is the host row's argmax.
TEST_F(CudaDFlash, recorded_decode_steps_with_captures_equal_eager_steps) {
  const int64_t V = target_.dev->spec().vocab;
  std::vector<float> logits[3], features[3];
  std::vector<int32_t> tokens[3];
  int64_t replayed[3] = {0, 0, 0};
  for (int mode = 0; mode < 3; ++mode) {
    Runner runner(*target_.dev, *be_);
    runner.set_step_graphs(mode > 0);
    SequenceState st(target_.dev->spec(), *be_);
    auto l = runner.prefill(st, prompt_);
    ASSERT_TRUE(l.ok());
    int32_t t = argmax(*l);
    for (int i = 0; i < 6; ++i) {
      Step step;
      step.tokens = std::span<const int32_t>(&t, 1);
      step.capture_layers = gpu_draft_->capture_layers();
      step.logits_on_device = mode == 2;
      auto o = runner.forward(st, step);
      ASSERT_TRUE(o.ok()) << o.status().to_string();
      ASSERT_EQ(o->features.size(), gpu_draft_->capture_layers().size());
      std::vector<float> row = o->logits;
      if (mode == 2) {
        ASSERT_TRUE(row.empty());
        row.resize(static_cast<size_t>(V));
        ASSERT_TRUE(be_->download(row.data(), o->device_logits.data(), V).ok());
        auto g = runner.greedy_token(*o);
        ASSERT_TRUE(g.ok()) << g.status().to_string();
        t = *g;
      } else {
        t = argmax(row);
      }
      logits[mode].insert(logits[mode].end(), row.begin(), row.end());
      for (const auto& f : o->features) features[mode].insert(features[mode].end(), f.begin(), f.end());
      tokens[mode].push_back(t);
    }
    replayed[mode] = runner.replayed_steps();
  }
  EXPECT_EQ(replayed[0], 0);
  for (int mode = 1; mode < 3; ++mode) {
    EXPECT_GE(replayed[mode], 4) << mode;  // recorded at the first step, replayed after
    EXPECT_EQ(logits[0], logits[mode]) << mode;
    EXPECT_EQ(features[0], features[mode]) << mode;
    EXPECT_EQ(tokens[0], tokens[mode]) << mode;
  }
}

// Verify steps recorded and replayed (Runner: a chain with captured recurrent state, and trees, every row's
// logits and the capture layers' outputs on the device) equal eager ones bit for bit, step after step, with
// the commits between them (a replay leaves the marks rollback_captured and commit_tree read); decoding from the
// committed states agrees too. Fresh random tokens, trees and accepted paths each step.
TEST_F(CudaDFlash, recorded_verify_steps_equal_eager_steps_bit_for_bit) {
  const int64_t V = 512, H = target_.dev->spec().hidden;
  test::SeededRng seeded;
  std::mt19937& rng = seeded.rng;
  for (const bool chain : {true, false}) {
    SCOPED_TRACE(chain ? "chain" : "tree");
    Runner eager(*target_.dev, *be_), graphs(*target_.dev, *be_);
    eager.set_verify_graphs(false);
    SequenceState se(target_.dev->spec(), *be_), sg(target_.dev->spec(), *be_);
    ASSERT_TRUE(eager.prefill(se, prompt_).ok());
    ASSERT_TRUE(graphs.prefill(sg, prompt_).ok());
    const int64_t n = chain ? 8 : 13;
    for (int step_i = 0; step_i < 5; ++step_i) {
      Nodes nodes = random_nodes(rng, n, chain);
      const std::vector<int32_t>& parents = nodes.parents;
      Step step = nodes.verify_step(chain, se.n_past());
      step.logits_on_device = true;
      step.capture_layers = gpu_draft_->capture_layers();
      step.features_on_device = true;
      std::vector<float> logits[2], features[2];
      SequenceState* states[2] = {&se, &sg};
      Runner* runners[2] = {&eager, &graphs};
      for (int r = 0; r < 2; ++r) {
        auto o = runners[r]->forward(*states[r], step);
        ASSERT_TRUE(o.ok()) << o.status().to_string();
        logits[r].resize(static_cast<size_t>(n * V));
        ASSERT_TRUE(be_->download(logits[r].data(), o->device_logits.data(), n * V).ok());
        for (const Buffer& f : o->device_features) {
          std::vector<float> h(static_cast<size_t>(n * H));
          ASSERT_TRUE(be_->download(h.data(), f.data(), n * H).ok());
          features[r].insert(features[r].end(), h.begin(), h.end());
        }
      }
      EXPECT_EQ(logits[0], logits[1]) << "step " << step_i;
      EXPECT_EQ(features[0], features[1]) << "step " << step_i;
      // Commit the same accepted prefix (a chain) or path (a tree: a random walk from the root) on both.
      std::vector<int32_t> path = {0};
      if (chain) {
        const int64_t keep = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(n));
        for (int64_t i = 1; i < keep; ++i) path.push_back(static_cast<int32_t>(i));
      } else {
        for (bool more = true; more;) {
          std::vector<int32_t> kids;
          for (int64_t i = 1; i < n; ++i)
            if (parents[i] == path.back()) kids.push_back(static_cast<int32_t>(i));
          more = !kids.empty() && rng() % 4 != 0;
          if (more) path.push_back(kids[rng() % kids.size()]);
        }
      }
      for (SequenceState* st : states) {
        const Status c = chain ? st->rollback_captured(static_cast<int64_t>(path.size())) : st->commit_tree(parents, path);
        ASSERT_TRUE(c.ok()) << c.to_string();
      }
      ASSERT_EQ(se.n_past(), sg.n_past());
    }
    EXPECT_GE(graphs.replayed_steps(), 3) << "verify steps after the first two should replay";
    EXPECT_EQ(eager.replayed_steps(), 0);
    // Plain decoding on from the committed states (recorded decode steps on both runners).
    int32_t t = 7;
    for (int i = 0; i < 3; ++i) {
      Step one;
      one.tokens = std::span<const int32_t>(&t, 1);
      auto oe = eager.forward(se, one);
      auto og = graphs.forward(sg, one);
      ASSERT_TRUE(oe.ok() && og.ok());
      EXPECT_EQ(oe->logits, og->logits) << "decode step " << i << " after the commits";
      t = argmax(oe->logits);
    }
  }
}

// Whole speculative decoding with recorded draft and verify steps gives, step by step, the tokens and acceptance
// of eager steps (and so plain decoding's text): the recordings compute what the eager steps compute.
TEST_F(CudaDFlash, recorded_speculative_steps_equal_eager_steps) {
  for (const bool ddtree : {false, true}) {
    SCOPED_TRACE(ddtree ? "ddtree" : "chain");
    std::vector<std::vector<int32_t>> steps[2];
    SpecStats stats[2];
    int64_t verify_replays = 0, draft_replays = 0;
    for (int graphs = 0; graphs < 2; ++graphs) {
      Runner runner(*target_.dev, *be_);
      runner.set_verify_graphs(graphs == 1);
      gpu_draft_->set_step_graphs(graphs == 1);
      SequenceState st(target_.dev->spec(), *be_);
      FeatureRing ring = feature_ring_for(*gpu_draft_, runner, 4096);
      auto pre = forward_capturing(runner, st, ring, gpu_draft_->capture_layers(), prompt_);
      ASSERT_TRUE(pre.ok()) << pre.status().to_string();
      int32_t root = argmax(pre->logits);
      DFlashDraft::Context ctx(*gpu_draft_);
      SpecOptions opts;
      opts.ddtree = ddtree;
      opts.ddtree_budget = 12;
      const ChooseFn greedy = [](NodeLogits& logits) -> Result<Choice> { return Choice{logits.argmax(), false}; };
      for (int i = 0; i < 16; ++i) {
        auto r = speculative_step(runner, st, ring, *gpu_draft_, ctx, root, 7, opts, greedy, &stats[graphs]);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        steps[graphs].push_back(r->tokens);
        root = r->tokens.back();
      }
      if (graphs == 1) {
        verify_replays = runner.replayed_steps();
        draft_replays = ctx.replayed_steps();
      }
    }
    gpu_draft_->set_step_graphs(true);
    EXPECT_EQ(steps[0], steps[1]);
    EXPECT_EQ(stats[0].accepted, stats[1].accepted);
    EXPECT_EQ(stats[0].drafted, stats[1].drafted);
    EXPECT_GE(verify_replays, 13) << "verify steps after the first two should replay";
    EXPECT_GE(draft_replays, 15) << "draft steps after the prompt's should replay (each count of new rows from "
                                    "its first step on)";
  }
}

}  // namespace
}  // namespace dflash
