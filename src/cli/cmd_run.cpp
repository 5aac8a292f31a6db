// dflash run --model M --prompt "..." [--chat] [-n N] [sampling flags]: generates text on the CPU engine and
// streams it to stdout; statistics (tokens, tokens/s) go to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "cli/commands.h"
#include "cli/draft_loader.h"
#include "cli/model_loader.h"
#include "server/generation.h"
#include "decode/runner.h"
#include "decode/sampler.h"
#include "model/weights.h"
#include "state/sequence_state.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/load_tokenizer.h"
#include "tokenizer/stream_detokenizer.h"

namespace dflash::cli {
namespace {

struct RunOptions {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  std::string system;
  bool chat = false;
  bool think = false;
  int64_t n_predict = 128;
  int threads = 0;
  PlacementFlags where;  // --device, or --target-devices and --target-layer-split
  SamplingParams sampling;
  uint64_t seed = 0;
  bool seed_set = false;
  DraftOptions draft;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Status run_generate(RunOptions opt) {
  DF_RETURN_IF_ERROR(model_or_default("run", opt.model));
  if (opt.seed_set) opt.sampling.seed = opt.seed;
  DF_RETURN_IF_ERROR(opt.sampling.validate());
  if (opt.n_predict < 0) return invalid_argument("-n must be >= 0");
  std::string prompt = opt.prompt;
  if (!opt.prompt_file.empty()) {
    DF_ASSIGN_OR_RETURN(prompt, read_text_file(opt.prompt_file));
  }
  DF_ASSIGN_OR_RETURN(Tokenizer tok, load_tokenizer(opt.model));
  if (opt.chat) {
    DF_ASSIGN_OR_RETURN(ChatTemplateSource src, load_chat_template(opt.model));
    DF_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::create(src));
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!opt.system.empty()) messages.push_back({{"role", "system"}, {"content", opt.system}});
    messages.push_back({{"role", "user"}, {"content", prompt}});
    nlohmann::ordered_json kwargs = {{"enable_thinking", opt.think}};
    DF_ASSIGN_OR_RETURN(prompt, tmpl.render(messages, nullptr, true, kwargs));
  }
  DF_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.encode(prompt, true));
  if (ids.empty()) return invalid_argument("the prompt is empty");

  auto t_load = std::chrono::steady_clock::now();
  DF_ASSIGN_OR_RETURN(LoadedModel model, load_model(opt.model, opt.where, opt.threads));
  const Weights& weights = model.weights();
  if (tok.size() > weights.spec().vocab)
    return invalid_argument("the tokenizer has {} tokens but the model only {}", tok.size(), weights.spec().vocab);
  server::Engine engine;
  DF_ASSIGN_OR_RETURN(std::unique_ptr<ResidentDraft> draft, load_draft(opt.draft, opt.model, model, opt.threads, &engine.spec));
  engine.draft = draft.get();
  engine.runner = model.runner.get();
  engine.tokenizer = &tok;
  const int64_t model_ctx = weights.spec().max_context > 0 ? weights.spec().max_context : 32768;
  engine.n_ctx = model_ctx;
  std::fprintf(stderr, "model: %s (%.1f MiB) loaded on %s in %.2f s\n", weights.spec().summary().c_str(),
               model.host->bytes() / 1048576.0, model.placement_name().c_str(), seconds_since(t_load));
  if (opt.n_predict == 0) return Status();
  server::GenerationRequest req;
  req.prompt = std::move(ids);
  req.sampling = opt.sampling;
  req.max_tokens = opt.n_predict;
  const auto sink = [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  DF_ASSIGN_OR_RETURN(server::GenerationResult r, server::generate(engine, req, sink));
  std::fputc('\n', stdout);
  std::fprintf(stderr, "prompt %lld tokens, prefill %.2f s (%.1f tok/s); generated %lld tokens, decode %.2f s (%.1f tok/s); "
               "finish %s; seed %llu\n",
               static_cast<long long>(r.prompt_tokens), r.prefill_ms / 1e3, r.prompt_tokens * 1e3 / std::max(r.prefill_ms, 1e-6),
               static_cast<long long>(r.completion_tokens), r.decode_ms / 1e3,
               r.completion_tokens * 1e3 / std::max(r.decode_ms, 1e-6), r.finish_reason.c_str(),
               static_cast<unsigned long long>(r.seed));
  if (r.speculative)
    std::fprintf(stderr, "speculative: %lld steps, drafted %lld, accepted %lld, %.2f tokens per step; %lld plain tokens\n",
                 static_cast<long long>(r.spec.steps), static_cast<long long>(r.spec.drafted),
                 static_cast<long long>(r.spec.accepted),
                 r.spec.steps > 0 ? static_cast<double>(r.spec.accepted + r.spec.steps) / r.spec.steps : 0.0,
                 static_cast<long long>(r.ar_tokens));
  return Status();
}

}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt (streams to stdout)");
  cmd->add_option("--model,-m", opt->model, model_option_help());
  auto* p = cmd->add_option("--prompt,-p", opt->prompt, "Prompt text");
  auto* f = cmd->add_option("--prompt-file", opt->prompt_file, "Read the prompt from a file");
  p->excludes(f);
  cmd->add_flag("--chat", opt->chat, "Wrap the prompt in the model's chat template as a user message");
  cmd->add_option("--system", opt->system, "System message (with --chat)");
  cmd->add_flag("--think", opt->think, "With --chat: enable_thinking = true (default false)");
  cmd->add_option("-n,--n-predict", opt->n_predict, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temperature,--temp", opt->sampling.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", opt->sampling.top_k, "0 = off")->capture_default_str();
  cmd->add_option("--top-p", opt->sampling.top_p, "1 = off")->capture_default_str();
  cmd->add_option("--min-p", opt->sampling.min_p, "0 = off")->capture_default_str();
  cmd->add_option("--repeat-penalty", opt->sampling.repetition_penalty, "1 = off")->capture_default_str();
  cmd->add_option("--presence-penalty", opt->sampling.presence_penalty, "0 = off")->capture_default_str();
  cmd->add_option("--frequency-penalty", opt->sampling.frequency_penalty, "0 = off")->capture_default_str();
  cmd->add_option("--repeat-last-n", opt->sampling.penalty_last_n, "Penalty window (-1 = all)")->capture_default_str();
  auto* seed = cmd->add_option("--seed", opt->seed, "RNG seed (default: random, printed on stderr)");
  cmd->add_option("--threads,-t", opt->threads, "CPU threads (default: all cores)");
  add_placement_flags(cmd, &opt->where);
  add_draft_options(cmd, opt->draft);
  cmd->callback([opt, seed, &exit_code] {
    RunOptions o = *opt;
    o.seed_set = seed->count() > 0;
    if (o.prompt.empty() && o.prompt_file.empty()) {
      exit_code = report(invalid_argument("give a prompt with --prompt or --prompt-file"));
      return;
    }
    Status st = run_generate(o);
    exit_code = st.ok() ? 0 : report(st);
  });
}

}  // namespace dflash::cli
