#include "server/generation.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "base/log.h"

namespace dflash::server {
namespace {

// Length of the longest prefix of s that ends on a UTF-8 character boundary.
size_t utf8_boundary(std::string_view s, size_t len) {
  while (len > 0 && len < s.size() && (static_cast<unsigned char>(s[len]) & 0xC0) == 0x80) --len;
  return len;
}

// log-softmax of the raw logits at `id`, and the `top` most likely ids with theirs.
TokenLogprob logprob_of(std::span<const float> logits, int32_t id, int top) {
  float mx = -INFINITY;
  for (float l : logits) mx = std::max(mx, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  const double lse = mx + std::log(sum);
  TokenLogprob t;
  t.id = id;
  t.logprob = static_cast<float>(logits[static_cast<size_t>(id)] - lse);
  if (top > 0) {
    std::vector<int32_t> idx(logits.size());
    std::iota(idx.begin(), idx.end(), 0);
    const auto k = static_cast<size_t>(std::min<int64_t>(top, static_cast<int64_t>(idx.size())));
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                      [&](int32_t a, int32_t b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
    for (size_t i = 0; i < k; ++i)
      t.top.emplace_back(idx[i], static_cast<float>(logits[static_cast<size_t>(idx[i])] - lse));
  }
  return t;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The token a chat template writes after an end-of-turn token ("\n"), or -1 when "\n" is not one token.
int32_t newline_id(const Tokenizer& tok) {
  auto ids = tok.encode("\n", false);
  return ids.ok() && ids->size() == 1 ? (*ids)[0] : -1;
}

}  // namespace

std::vector<int64_t> prefill_cuts(std::span<const int32_t> prompt, std::span<const int32_t> turn_ends,
                                  int32_t newline, int64_t min_segment) {
  const auto n = static_cast<int64_t>(prompt.size());
  std::vector<int64_t> cuts;
  int64_t last = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::find(turn_ends.begin(), turn_ends.end(), prompt[static_cast<size_t>(i)]) == turn_ends.end()) continue;
    int64_t b = i + 1;
    if (b < n && newline >= 0 && prompt[static_cast<size_t>(b)] == newline) ++b;
    if (b < n && b - last >= min_segment) {
      cuts.push_back(b);
      last = b;
    }
  }
  if (n > 0) cuts.push_back(n);
  return cuts;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const auto& s : stops_) max_len_ = std::max(max_len_, s.size());
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  const size_t release = utf8_boundary(held_, held_.size() - keep);
  std::string out = held_.substr(0, release);
  held_.erase(0, release);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? std::string() : out;
}

Generation::Generation(const Engine& engine, GenerationRequest req, TextSink sink, const std::atomic<bool>* cancel,
                       std::chrono::steady_clock::time_point deadline)
    : engine_(engine),
      req_(std::move(req)),
      sink_(std::move(sink)),
      cancel_(cancel),
      deadline_(deadline),
      stops_(req_.stop) {}

Status Generation::start(SequenceState& state) {
  if (engine_.runner == nullptr || engine_.tokenizer == nullptr) return internal_error("the engine is not loaded");
  DF_RETURN_IF_ERROR(req_.sampling.validate());
  if (req_.top_logprobs > 20) return invalid_argument("top_logprobs must be at most 20");
  const auto n_prompt = static_cast<int64_t>(req_.prompt.size());
  if (n_prompt == 0) return invalid_argument("the prompt is empty");
  if (req_.max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
  if (n_prompt + req_.max_tokens > engine_.n_ctx)
    return invalid_argument("the prompt ({} tokens) plus max_tokens ({}) exceed the context of {} tokens", n_prompt,
                            req_.max_tokens, engine_.n_ctx);
  const int64_t vocab = engine_.runner->spec().vocab;
  for (int32_t t : req_.prompt)
    if (t < 0 || t >= vocab) return invalid_argument("token id {} is outside the vocabulary of {}", t, vocab);
  for (const auto& [t, bias] : req_.sampling.logit_bias)
    if (t < 0 || t >= vocab)
      return invalid_argument("'logit_bias' names token id {}, outside the vocabulary of {}", t, vocab);
  DF_RETURN_IF_ERROR(state.status());
  if (state.n_past() != 0) return internal_error("a generation needs an empty sequence ({} tokens in it)", state.n_past());
  DF_ASSIGN_OR_RETURN(Sampler sampler, Sampler::create(req_.sampling));
  sampler_.emplace(std::move(sampler));
  json_.reset();
  if (req_.json_object) {
    if (engine_.json != nullptr)
      json_.emplace(*engine_.json);
    else
      json_.emplace(*engine_.tokenizer);
  }
  detok_.emplace(*engine_.tokenizer, /*skip_special=*/true);
  eog_ = engine_.tokenizer->vocab().end_of_generation_ids();
  history_ = req_.prompt;
  state_ = &state;
  res_ = GenerationResult();
  res_.prompt_tokens = n_prompt;
  res_.finish_reason = "length";
  res_.seed = sampler_->seed();
  prefilled_ = 0;
  cuts_ = prefill_cuts(req_.prompt, eog_, newline_id(*engine_.tokenizer), kMinPrefixSegment);
  next_cut_ = 0;
  // Snapshots where the next request is likely to branch: the first turn boundary (the end of the system
  // or tools block), the last two (after the last assistant turn, after the last user turn), the end.
  exports_.clear();
  const size_t n_turns = cuts_.size() - 1;  // cuts before the prompt's end
  if (n_turns >= 1) exports_.push_back(cuts_.front());
  if (n_turns >= 2) exports_.push_back(cuts_[n_turns - 2]);
  if (n_turns >= 1) exports_.push_back(cuts_[n_turns - 1]);
  exports_.push_back(n_prompt);
  std::sort(exports_.begin(), exports_.end());
  exports_.erase(std::unique(exports_.begin(), exports_.end()), exports_.end());
  logits_.clear();
  greedy_next_.reset();
  disk_writes_.clear();
  root_.reset();
  ar_left_ = judged_steps_ = judged_tokens_ = 0;
  backoff_ = 16;
  spec_ms_per_token_ = ar_ms_per_token_ = 0;
  if (engine_.draft != nullptr && engine_.spec.adaptive && engine_.spec_history != nullptr) {
    // Start where the last requests left the judgement: plain first when drafting did not pay.
    const SpecHistory::State h = engine_.spec_history->get();
    ar_ms_per_token_ = h.ar_ms_per_token;
    backoff_ = h.backoff;
    // At most 128 plain tokens before this request judges the draft itself (its text may suit the draft).
    if (!h.paying) ar_left_ = std::min<int64_t>(h.backoff, 128);
  }
  if (engine_.draft != nullptr && draft_ == nullptr) {
    DF_ASSIGN_OR_RETURN(draft_, engine_.draft->acquire());
    draft_ctx_ = std::make_unique<DFlashDraft::Context>(*draft_);
    ring_.emplace(feature_ring_for(*draft_, *engine_.runner, engine_.spec.feature_window));
    res_.speculative = true;
  }
  if ((engine_.prefix_cache != nullptr && engine_.prefix_cache->enabled()) || engine_.disk_cache != nullptr)
    restore_prefix();
  return Status();
}

Generation::~Generation() {
  queue_disk_writes();
  release_draft();
}

void Generation::release_draft() {
  if (draft_ == nullptr) return;
  draft_ctx_.reset();  // its K/V live on the draft's backend: freed before the draft may be parked
  engine_.draft->release();
  draft_ = nullptr;
}

void Generation::queue_disk_writes() {
  if (engine_.disk_cache != nullptr)
    for (auto& snap : disk_writes_) engine_.disk_cache->enqueue(std::move(snap));
  disk_writes_.clear();
}

std::shared_ptr<const Snapshot> Generation::disk_lookup(std::span<const int64_t> lengths, bool count_miss) {
  DiskCache& disk = *engine_.disk_cache;
  const auto n_prompt = static_cast<int64_t>(req_.prompt.size());
  const int64_t vocab = engine_.runner->spec().vocab;
  while (!lengths.empty()) {
    std::shared_ptr<const Snapshot> snap = disk.lookup(req_.prompt, lengths, count_miss);
    if (snap == nullptr) return nullptr;
    const auto n_logits = static_cast<int64_t>(snap->last_logits.size());
    if (n_logits == vocab || (n_logits == 0 && snap->n_past < n_prompt)) return snap;
    // Logits of another vocabulary: not this model's file after all. No logits: usable only as a shorter
    // prefix of a longer prompt.
    if (n_logits != 0) disk.discard(snap->tokens, fmt::format("its logits have {} entries, the vocabulary {}", n_logits, vocab));
    while (!lengths.empty() && lengths.back() >= snap->n_past) lengths = lengths.first(lengths.size() - 1);
  }
  return nullptr;
}

void Generation::restore_prefix() {
  const auto t0 = std::chrono::steady_clock::now();
  PrefixCache* cache = engine_.prefix_cache != nullptr && engine_.prefix_cache->enabled() ? engine_.prefix_cache : nullptr;
  const auto n_prompt = static_cast<int64_t>(req_.prompt.size());
  std::shared_ptr<const Snapshot> snap;
  if (cache != nullptr) {
    snap = cache->lookup(req_.prompt, cuts_);
    // The whole prompt needs the logits of its last token to sample from: a snapshot without them can only
    // serve as a shorter prefix.
    if (snap != nullptr && snap->n_past == n_prompt &&
        static_cast<int64_t>(snap->last_logits.size()) != engine_.runner->spec().vocab) {
      snap = cache->lookup(req_.prompt, std::span<const int64_t>(cuts_).first(cuts_.size() - 1));
    }
  }
  // The disk, for the cuts beyond what memory had (after a restart memory holds the system prompt of the
  // first conversation; the disk, whole conversations). A miss is counted only when memory missed too.
  bool from_disk = false;
  if (engine_.disk_cache != nullptr) {
    const int64_t have = snap != nullptr ? snap->n_past : 0;
    const auto above = std::upper_bound(cuts_.begin(), cuts_.end(), have);
    const std::span<const int64_t> longer(above, cuts_.end());
    std::shared_ptr<const Snapshot> d = longer.empty() ? nullptr : disk_lookup(longer, snap == nullptr);
    if (d != nullptr) {
      if (const Status st = state_->import_snapshot(*d); st.ok()) {
        log::info("disk cache: restored {} tokens ({:.1f} MiB) in {:.1f} ms", d->n_past,
                  static_cast<double>(snapshot_bytes(*d)) / (1 << 20), ms_since(t0));
        if (cache != nullptr) cache->insert(d);
        snap = std::move(d);
        from_disk = true;
      } else {
        // Read back whole, yet not this model's shapes: the file goes; memory's shorter prefix may still do.
        engine_.disk_cache->discard(d->tokens, st.message());
        state_->reset();
      }
    }
  }
  if (snap == nullptr) return;
  if (!from_disk) {
    if (const Status st = state_->import_snapshot(*snap); !st.ok()) {
      log::warn("prefix cache: a snapshot of {} tokens does not fit this model ({}); prefilling from the start",
                snap->n_past, st.message());
      state_->reset();
      return;
    }
  }
  prefilled_ = snap->n_past;
  if (prefilled_ == n_prompt) logits_ = snap->last_logits;
  // The draft's feature window, when the snapshot has one for this draft (else the draft's context starts here).
  if (ring_) ring_->import_from(*snap);
  while (next_cut_ < cuts_.size() && cuts_[next_cut_] <= prefilled_) ++next_cut_;
  res_.cached_tokens = prefilled_;
  res_.disk_hit = from_disk;
  res_.prefill_ms += ms_since(t0);
}

void Generation::export_prefix(int64_t pos) {
  if (!std::binary_search(exports_.begin(), exports_.end(), pos)) return;
  PrefixCache* cache = engine_.prefix_cache != nullptr && engine_.prefix_cache->enabled() ? engine_.prefix_cache : nullptr;
  DiskCache* disk = engine_.disk_cache;
  const auto ids = std::span<const int32_t>(req_.prompt).first(static_cast<size_t>(pos));
  // In memory already: another request left it (the same prompt in another slot), and queued it for the
  // disk when it ended (or it came from the disk).
  if (cache != nullptr && cache->contains(ids)) return;
  const bool to_disk = disk != nullptr && disk->wants(ids);
  if (cache == nullptr && !to_disk) return;
  // A copy of the state to the host: on a device backend this costs a download of the KV so far.
  Result<Snapshot> snap = state_->export_snapshot();
  if (!snap.ok()) {
    log::warn("prefix cache: no snapshot at {} tokens: {}", pos, snap.status().message());
    return;
  }
  snap->tokens.assign(ids.begin(), ids.end());
  snap->last_logits = logits_;
  if (ring_) ring_->export_to(*snap);
  auto shared = std::make_shared<const Snapshot>(std::move(snap).value());
  if (cache != nullptr) cache->insert(shared);
  if (to_disk) disk_writes_.push_back(std::move(shared));
}

Status Generation::check_live() const {
  if (cancel_ != nullptr && cancel_->load()) return Status(ErrorCode::kCancelled, "the client went away");
  if (std::chrono::steady_clock::now() > deadline_) return Status(ErrorCode::kCancelled, "the request deadline passed");
  return Status();
}

Status Generation::emit(const std::string& text) {
  if (text.empty()) return Status();
  res_.text += text;
  if (!sink_ || sink_(text)) return Status();
  return Status(ErrorCode::kCancelled, "the client went away");
}

Status Generation::finish() {
  if (stops_.stopped()) return Status();
  DF_RETURN_IF_ERROR(emit(stops_.push(detok_->finish())));
  if (stops_.stopped()) res_.finish_reason = "stop";
  return emit(stops_.flush());
}

Result<bool> Generation::step() {
  if (state_ == nullptr) return internal_error("Generation::step() before a successful start()");
  DF_RETURN_IF_ERROR(check_live());
  const auto t0 = std::chrono::steady_clock::now();
  if (prefilling()) {
    // One chunk of the running segment (chunks counted from the segment's start, which is a cut); the
    // last chunk of the prompt leaves the logits the first token is sampled from.
    const int64_t cut = cuts_[next_cut_];
    const int64_t len = std::min(engine_.runner->prefill_chunk(), cut - prefilled_);
    const auto chunk = std::span<const int32_t>(req_.prompt).subspan(static_cast<size_t>(prefilled_),
                                                                     static_cast<size_t>(len));
    DF_RETURN_IF_ERROR(evaluate(chunk));  // one step (a chunk is at most prefill_chunk() tokens)
    prefilled_ += len;
    if (prefilled_ == cut) {
      ++next_cut_;
      export_prefix(cut);
    }
    res_.prefill_ms += ms_since(t0);
    return false;
  }
  // Decode: a speculative step (draft, verify, accept) when the draft runs, else one token.
  bool done = false, ran = false;
  if (draft_ != nullptr) {
    DF_ASSIGN_OR_RETURN(done, speculative_decode(&ran));
  }
  if (!ran) {
    const auto t_ar = std::chrono::steady_clock::now();
    if (root_) {  // drafting paused with a chosen root: evaluate it first
      const int32_t root = *root_;
      root_.reset();
      DF_RETURN_IF_ERROR(evaluate(std::span<const int32_t>(&root, 1), argmax_only()));
    }
    DF_ASSIGN_OR_RETURN(done, take_next());
    if (!done) DF_RETURN_IF_ERROR(evaluate(std::span<const int32_t>(&history_.back(), 1), argmax_only()));
    if (draft_ != nullptr) {
      ++res_.ar_tokens;
      adapt(false, 1, ms_since(t_ar));
    }
  }
  if (done) {
    DF_RETURN_IF_ERROR(finish());
    queue_disk_writes();  // the output is complete: the writer's I/O cannot delay it
    release_draft();
  }
  res_.decode_ms += ms_since(t0);
  return done;
}

Result<bool> Generation::take_token(std::span<const float> logits) {
  // Under response_format json_object the token is drawn from the tokens that keep the output a JSON
  // object prefix; logprobs stay those of the model's raw distribution.
  int32_t next = 0;
  if (json_) {
    DF_ASSIGN_OR_RETURN(next, constrained_sample(*sampler_, *json_, logits, history_, &masked_));
    DF_RETURN_IF_ERROR(json_->accept(next));
  } else {
    DF_ASSIGN_OR_RETURN(next, sampler_->sample(logits, history_));
  }
  if (req_.top_logprobs >= 0) res_.logprobs.push_back(logprob_of(logits, next, req_.top_logprobs));
  return commit_token(next);
}

Result<bool> Generation::commit_token(int32_t next) {
  history_.push_back(next);
  ++res_.completion_tokens;
  if (std::find(eog_.begin(), eog_.end(), next) != eog_.end()) {
    res_.finish_reason = "stop";
    return true;
  }
  DF_RETURN_IF_ERROR(emit(stops_.push(detok_->push(next))));
  if (stops_.stopped()) {
    res_.finish_reason = "stop";
    return true;
  }
  return res_.completion_tokens == req_.max_tokens;
}

Result<bool> Generation::take_next() {
  if (!greedy_next_) return take_token(logits_);
  const int32_t next = *greedy_next_;
  greedy_next_.reset();
  return commit_token(next);
}

bool Generation::argmax_only() const { return req_.sampling.plain_argmax() && !json_ && req_.top_logprobs < 0; }

Status Generation::evaluate(std::span<const int32_t> tokens, bool greedy) {
  greedy_next_.reset();
  if (ring_) {
    DF_ASSIGN_OR_RETURN(StepOutput out,
                        forward_capturing(*engine_.runner, *state_, *ring_, draft_->capture_layers(), tokens));
    logits_ = std::move(out.logits);
    return Status();
  }
  Step step;
  step.tokens = tokens;
  step.logits_on_device = greedy;
  DF_ASSIGN_OR_RETURN(StepOutput out, engine_.runner->forward(*state_, step));
  if (greedy) {
    logits_.clear();
    DF_ASSIGN_OR_RETURN(const int32_t next, engine_.runner->greedy_token(out));
    greedy_next_ = next;
    return Status();
  }
  logits_ = std::move(out.logits);
  return Status();
}

Result<bool> Generation::speculative_decode(bool* ran) {
  *ran = false;
  if (ar_left_ > 0) return false;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t before = res_.completion_tokens;
  if (!root_) {  // the block's root: chosen from the last evaluated logits as plain decoding would
    // Chosen from logits a plain step (or the prefill) left: a plain token, not one of a draft step.
    ++res_.ar_tokens;
    DF_ASSIGN_OR_RETURN(bool done, take_next());
    *ran = true;
    if (done) return true;
    root_ = history_.back();
  }
  // Drafted tokens that can still be used: within the token budget (the root's step emits up to drafts + 1
  // tokens) and the target's context.
  int64_t max_drafts = std::min(req_.max_tokens - res_.completion_tokens - 1, draft_->block_size() - 1);
  const int64_t model_ctx = engine_.runner->spec().max_context;
  if (model_ctx > 0) max_drafts = std::min(max_drafts, model_ctx - state_->n_past() - 1);
  if (max_drafts < 1) return false;  // the last token(s): one at a time
  // Plain greedy needs only each node's argmax (reduced on the device); anything else reads the node's row.
  const bool argmax_only = this->argmax_only();
  const ChooseFn choose = [this, argmax_only](NodeLogits& logits) -> Result<Choice> {
    bool done = false;
    if (argmax_only) {
      DF_ASSIGN_OR_RETURN(const int32_t token, logits.greedy());
      DF_ASSIGN_OR_RETURN(done, commit_token(token));
    } else {
      DF_ASSIGN_OR_RETURN(std::span<const float> row, logits.row());
      DF_ASSIGN_OR_RETURN(done, take_token(row));
    }
    return Choice{history_.back(), done};
  };
  DF_ASSIGN_OR_RETURN(SpecStepResult r, speculative_step(*engine_.runner, *state_, *ring_, *draft_, *draft_ctx_, *root_,
                                                         max_drafts, engine_.spec, choose, &res_.spec));
  *ran = true;
  root_.reset();
  if (r.stopped) return true;
  root_ = r.tokens.back();
  adapt(true, res_.completion_tokens - before, ms_since(t0));
  return false;
}

void Generation::adapt(bool drafted, int64_t tokens, double ms) {
  const double per_token = ms / static_cast<double>(std::max<int64_t>(tokens, 1));
  auto average = [](double& avg, double x) { avg = avg == 0 ? x : 0.75 * avg + 0.25 * x; };
  if (!drafted) {
    average(ar_ms_per_token_, per_token);
    if (ar_left_ > 0) --ar_left_;
    return;
  }
  if (!engine_.spec.adaptive) return;
  average(spec_ms_per_token_, per_token);
  ++judged_steps_;
  judged_tokens_ += tokens;
  constexpr int64_t kJudgeSteps = 4;
  if (judged_steps_ < kJudgeSteps) return;
  bool paying = true;
  if (ar_ms_per_token_ == 0) {
    // No plain step measured yet: a few plain tokens measure one (drafting resumes right after).
    ar_left_ = 4;
  } else if (spec_ms_per_token_ < ar_ms_per_token_) {
    backoff_ = 16;  // drafting pays: keep drafting
  } else {
    // It does not pay here: plain decoding for a while (doubling while it keeps not paying).
    paying = false;
    ar_left_ = backoff_;
    backoff_ = std::min<int64_t>(2 * backoff_, 1024);
  }
  if (engine_.spec_history != nullptr) engine_.spec_history->put({ar_ms_per_token_, backoff_, paying});
  judged_steps_ = judged_tokens_ = 0;
  spec_ms_per_token_ = 0;
}

Result<GenerationResult> generate(const Engine& engine, const GenerationRequest& req, const TextSink& sink,
                                  const std::atomic<bool>* cancel, std::chrono::steady_clock::time_point deadline) {
  if (engine.runner == nullptr || engine.tokenizer == nullptr) return internal_error("the engine is not loaded");
  Generation gen(engine, req, sink, cancel, deadline);
  SequenceState state(engine.runner->spec(), engine.runner->state_layout());
  DF_RETURN_IF_ERROR(gen.start(state));
  for (;;) {
    DF_ASSIGN_OR_RETURN(bool done, gen.step());
    if (done) return gen.take_result();
  }
}

}  // namespace dflash::server
