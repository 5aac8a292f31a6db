// One completion on the engine: prefill of the prompt, then the decode loop with sampling, end-of-generation
// tokens, stop strings, a token budget, a deadline and cancellation; text leaves through a sink as soon
// as no stop string can still claim it. `Generation` runs it a step at a time (what the scheduler
// interleaves across slots); `generate()` runs one to the end on a fresh sequence. With a prefix cache
// the prefill starts from the longest cached prefix of the prompt and leaves snapshots at turn boundaries.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "decode/dflash.h"
#include "decode/json_constraint.h"
#include "decode/resident_draft.h"
#include "decode/runner.h"
#include "decode/sampler.h"
#include "cache/disk_cache.h"
#include "cache/prefix_cache.h"
#include "state/sequence_state.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace dflash::server {

// What drafting was last measured to be worth on an engine, shared by its requests (thread-safe): each
// request's adaptive choice between drafting and plain decoding starts from it instead of probing afresh.
class SpecHistory {
 public:
  struct State {
    double ar_ms_per_token = 0;  // plain decoding's time per token (0: not measured yet)
    int64_t backoff = 16;        // the next fallback's length in tokens
    bool paying = true;          // the last judgement: drafting was faster per token
  };
  State get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return state_;
  }
  void put(const State& s) {
    std::lock_guard<std::mutex> lock(mu_);
    state_ = s;
  }

 private:
  mutable std::mutex mu_;
  State state_;
};

// What the server generates with (owned by the caller, outliving the server).
struct Engine {
  Runner* runner = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: the model has none (chat endpoints refuse)
  bool xml_tool_calls = false;  // the template writes calls as <function=NAME> (Qwen3.5), not JSON (Qwen3)
  std::string model_id;
  int64_t n_ctx = 0;    // prompt + generated tokens a request may use
  std::string device;   // "cpu", "cuda:0", or a split's "cuda:0[0,18) cpu[18,36)" (for /props)
  std::vector<std::string> shard_devices;  // the device of each of runner's shards (for /props)
  std::string version;  // dflash's version (for /props)
  // The tokenizer's JSON constraint, built once (its token table) and copied per json_object request;
  // null: built per request.
  const JsonConstraint* json = nullptr;
  // Snapshots of prompt prefixes shared by every slot (thread-safe); null or disabled: every prompt is
  // prefilled from its start.
  PrefixCache* prefix_cache = nullptr;
  // Snapshots persisted in a directory (thread-safe); null: none. Looked up when memory has no prefix of
  // the prompt as long as the disk may; a disk hit also goes to prefix_cache. The snapshots a request
  // exports are queued to its writer when the request ends.
  DiskCache* disk_cache = nullptr;
  // The DFlash draft (null: plain decoding) and how requests draft with it. A request acquires the draft at
  // start() and releases it when it ends (the residency policy may park it in between requests).
  ResidentDraft* draft = nullptr;
  SpecOptions spec;
  SpecHistory* spec_history = nullptr;  // null: every request judges the draft from scratch
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 0;          // generated tokens at most (>= 1)
  std::vector<std::string> stop;   // stop strings (not included in the output)
  int top_logprobs = -1;           // -1: no logprobs; 0..20: each token's and this many alternatives
  bool json_object = false;        // response_format json_object: every token keeps the output a prefix of
                                   // one JSON object (JsonConstraint); the object's end allows only EOG
};

// A generated token's log-probability under the model (log-softmax of its raw logits) and the most
// likely alternatives.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

struct GenerationResult {
  std::string text;
  std::string finish_reason;  // "stop" (end of generation or a stop string) or "length"
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens restored from the prefix cache instead of evaluated
  bool disk_hit = false;      // they came from a snapshot file (DiskCache), not from memory
  int64_t completion_tokens = 0;
  double prefill_ms = 0;  // time spent in this request's prefill steps (not in other slots' steps between them)
  double decode_ms = 0;   // likewise for its decode steps
  std::vector<TokenLogprob> logprobs;  // per generated token, when asked for
  uint64_t seed = 0;         // the sampler's seed (the request's, or the random one it chose)
  bool speculative = false;  // decoded with the DFlash draft
  SpecStats spec;            // its acceptance counters
  int64_t ar_tokens = 0;     // tokens chosen outside draft steps (the first one, those of the adaptive fallback):
                             // completion_tokens = spec.steps + spec.accepted + ar_tokens
};

// Receives text as it becomes final; returns false when the receiver is gone (the request is cancelled).
using TextSink = std::function<bool(std::string_view delta)>;

// Holds back the end of the generated text while it could still be the start of a stop string, and
// finds the first stop string. Bytes are only released at UTF-8 character boundaries.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Appends text; returns the newly releasable text. After a stop string is found, stopped() is true,
  // the text up to it has been released and everything after is dropped.
  std::string push(std::string_view text);
  // The text still held back (at the end of generation).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string held_;
  bool stopped_ = false;
};

// Where a prompt's prefill is cut: after every end-of-turn token (`turn_ends`, e.g. <|im_end|>) and the
// `newline` token that follows it, if one does (-1: none), skipping a cut whose segment (from the previous
// cut, or 0) is shorter than `min_segment` tokens; then the prompt's end. Ascending, the last one is the
// prompt's length. A cut below position p depends only on the ids before p, so two prompts that share
// their first p ids share their cuts below p: that is what makes a snapshot taken at a cut of one prompt
// continue exactly like a cold prefill of the other (Generation's step schedule below).
std::vector<int64_t> prefill_cuts(std::span<const int32_t> prompt, std::span<const int32_t> turn_ends,
                                  int32_t newline, int64_t min_segment);

// One request's generation, advanced a step at a time so that one thread can interleave several.
// start() checks the request and binds it to a sequence; each step() then does one piece of work: a
// chunk of the prompt, or one generated token (sampled, emitted through the sink, and fed back). The output
// does not depend on how steps of different generations interleave.
//
// The prefill schedule is a function of the prompt alone: the prompt is cut at prefill_cuts() (turn
// boundaries and its end) and each segment is evaluated in chunks of the runner's prefill_chunk() tokens
// from the segment's start (a prompt without turn boundaries: Runner::prefill's chunks). Kernels whose results depend
// on how tokens are split into steps (DeltaNet's chunked form) therefore run the same steps after a cut
// whether the prefill started cold or from a snapshot taken at that cut: a restored prefix continues bit for
// bit like a cold prefill (on the CPU). With an enabled Engine::prefix_cache, start() restores the longest
// cached prefix whose length is one of the prompt's cuts (the whole prompt included: then no forward runs,
// the first token comes from the snapshot's logits), and the prefill exports a snapshot at the cuts where
// a later request is likely to branch, above the restored position: the first turn boundary (the system or
// tools block), the last two (after the last assistant turn, after the last user turn) and the prompt's end.
// With an Engine::disk_cache, a cut longer than any that memory holds is looked up on disk too (the read
// runs on the caller's thread), and the exported snapshots that memory did not already hold (and that the
// disk wants: DiskCache::wants) are queued to its writer when the generation ends.
// Not thread-safe: one thread drives a Generation (the sink runs on that thread).
class Generation {
 public:
  // A turn boundary closer than this to the previous cut is not a cut: a skipped boundary costs a later
  // request at most this many extra prompt tokens, and a short prompt stays one step.
  static constexpr int64_t kMinPrefixSegment = 32;
  // The version of the prefill schedule (prefill_cuts, kMinPrefixSegment, and how a segment is stepped; the
  // chunk, Runner::prefill_chunk(), is bound beside it): snapshot files are bound to it (the server folds it
  // into SnapshotIdentity::layout_hash), so a change here must bump it, and files written under another
  // schedule are then not restored.
  static constexpr int kPrefillScheduleVersion = 2;  // 2: chunks of 512 tokens (were 256)

  // `cancel` (may be null) must outlive the generation; the engine too.
  Generation(const Engine& engine, GenerationRequest req, TextSink sink, const std::atomic<bool>* cancel = nullptr,
             std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;
  // Queues the snapshots this request exported for the disk cache (if it did not finish: they are still
  // valid prefixes).
  ~Generation();

  // Checks the request (the errors generate() lists, but no engine work) and binds the generation to
  // `state`, which must be empty (n_past 0, as after SequenceState::reset()) and outlive it. With a prefix
  // cache, restores the longest cached prefix into `state` (result().cached_tokens).
  Status start(SequenceState& state);
  // One step; true when the generation has finished (result() is complete). Errors (the sink refusing
  // text, cancellation or the deadline, checked before every step; engine failures) end the generation:
  // step() must not be called again after an error or after true.
  Result<bool> step();
  bool prefilling() const { return prefilled_ < static_cast<int64_t>(req_.prompt.size()); }
  // The cuts of this prompt's prefill (prefill_cuts; the last is the prompt's length).
  const std::vector<int64_t>& cuts() const { return cuts_; }
  // [V] logits of the last evaluated token (after the prefill: what the first token is sampled from; empty after
  // a decode step of an argmax-only request, whose token was reduced on the backend).
  const std::vector<float>& logits() const { return logits_; }
  const GenerationRequest& request() const { return req_; }
  const GenerationResult& result() const { return res_; }
  GenerationResult take_result() { return std::move(res_); }

 private:
  Status check_live() const;
  Status emit(const std::string& text);
  // The end of a generation: the detokenizer's and the stop matcher's held-back text.
  Status finish();
  // Restores the longest cached prefix of the prompt into state_ (a miss or a snapshot that does not fit
  // leaves it empty): memory first, then the disk for cuts beyond what memory had.
  void restore_prefix();
  // The longest snapshot on disk among `lengths` usable for this prompt (a snapshot of the whole prompt
  // needs its [V] logits), or null. Counts a disk miss when `count_miss`.
  std::shared_ptr<const Snapshot> disk_lookup(std::span<const int64_t> lengths, bool count_miss);
  // Hands the snapshots exported for the disk to its writer (when the generation ends; idempotent).
  void queue_disk_writes();
  // After the prefill reached cut `pos`: keeps a snapshot of the state there if it is one of exports_.
  void export_prefix(int64_t pos);
  // Samples the next token from `logits` (the request's sampler, JSON constraint, logprobs), accounts for it
  // and emits its text; true when the generation ends with it (end of generation, stop string, budget).
  Result<bool> take_token(std::span<const float> logits);
  // take_token of the last evaluated token: its device-reduced greedy choice where evaluate() took one, else
  // take_token(logits_).
  Result<bool> take_next();
  // Plain greedy decoding (no bias, penalties, JSON constraint or logprobs): the next token is the argmax alone.
  bool argmax_only() const;
  // Accounts for the chosen token `next` and emits its text (take_token's second half).
  Result<bool> commit_token(int32_t next);
  // One target forward of `tokens` after the state (features captured into ring_ when drafting); logits of
  // the last token into logits_, or with `greedy` (a decode step of an argmax_only() request, not drafting)
  // only their argmax into greedy_next_, reduced on the backend: one id crosses to the host, not the row.
  Status evaluate(std::span<const int32_t> tokens, bool greedy = false);
  // A decode step with the draft (speculative_step), when it may run now; *ran = false otherwise.
  Result<bool> speculative_decode(bool* ran);
  // Updates the adaptive choice between drafting and plain decoding after a step of `tokens` in `ms`.
  void adapt(bool drafted, int64_t tokens, double ms);
  // Releases the draft (idempotent).
  void release_draft();

  const Engine& engine_;
  GenerationRequest req_;
  TextSink sink_;
  const std::atomic<bool>* cancel_;
  std::chrono::steady_clock::time_point deadline_;
  SequenceState* state_ = nullptr;
  std::optional<Sampler> sampler_;
  std::optional<JsonConstraint> json_;  // json_object requests: what the output may continue with
  std::vector<float> masked_;           // constrained_sample's scratch row
  std::optional<StreamDetokenizer> detok_;
  StopMatcher stops_;
  std::vector<int32_t> eog_;
  std::vector<int32_t> history_;  // prompt + generated ids (the sampler's penalty window)
  std::vector<float> logits_;     // [V] of the last evaluated token: what the next token is sampled from
  std::optional<int32_t> greedy_next_;  // instead of logits_ after a greedy evaluate(): their argmax
  int64_t prefilled_ = 0;         // prompt tokens evaluated (or restored) so far
  std::vector<int64_t> cuts_;     // prefill_cuts of the prompt
  size_t next_cut_ = 0;           // cuts_[next_cut_]: where the running segment ends
  std::vector<int64_t> exports_;  // the cuts where a snapshot goes to the prefix cache (ascending)
  std::vector<std::shared_ptr<const Snapshot>> disk_writes_;  // exported, for the disk cache at the end
  GenerationResult res_;
  // Speculative decoding (Engine::draft): the acquired draft, its context, the target features.
  DFlashDraft* draft_ = nullptr;
  std::unique_ptr<DFlashDraft::Context> draft_ctx_;
  std::optional<FeatureRing> ring_;
  std::optional<int32_t> root_;  // chosen and emitted, not evaluated yet (the next block's root)
  // Adaptive fallback: per-token times (moving averages) of drafting and of plain steps; plain tokens left
  // before drafting is tried again; the next fallback's length; steps judged since the last switch.
  double spec_ms_per_token_ = 0, ar_ms_per_token_ = 0;
  int64_t ar_left_ = 0, backoff_ = 16, judged_steps_ = 0, judged_tokens_ = 0;
};

// Runs the request on a fresh sequence (a Generation stepped to its end). Errors: invalid parameters or a
// prompt plus max_tokens beyond n_ctx (kInvalidArgument), the sink refusing text, *cancel set, or the
// deadline passing (kCancelled, checked every step), engine failures.
Result<GenerationResult> generate(const Engine& engine, const GenerationRequest& req, const TextSink& sink,
                                  const std::atomic<bool>* cancel = nullptr,
                                  std::chrono::steady_clock::time_point deadline =
                                      std::chrono::steady_clock::time_point::max());

}  // namespace dflash::server
