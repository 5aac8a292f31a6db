// dflash serve MODEL [--host H] [--port P] [--device cpu|cuda:N] [--parallel N] [--prefix-cache-mib N]
// [--kv-cache-dir DIR [--kv-cache-budget MIB] [--kv-cache-min-tokens N]] [--api-key K | --api-key-file F]
// ...: the OpenAI-compatible server (server/http_server.h). It listens first (/health answers 503 while
// the model loads and the snapshot directory is scanned), then serves until SIGINT/SIGTERM.
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

#include "base/file_io.h"
#include "base/log.h"
#include "cli/commands.h"
#include "cli/draft_loader.h"
#include "cli/model_loader.h"
#include "server/http_server.h"
#include "cache/disk_cache.h"
#include "cache/prefix_cache.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/load_tokenizer.h"

namespace dflash::cli {
namespace {

struct ServeOptions {
  std::string model;
  PlacementFlags where;  // --device, or --target-devices and --target-layer-split
  int threads = 0;
  int64_t ctx = 0;  // 0: the model's own context (capped at 32768)
  int64_t prefix_cache_mib = 1024;  // host memory for prompt-prefix snapshots; 0: off
  std::string kv_cache_dir;          // snapshot files (DiskCache); empty: no disk cache
  double kv_cache_budget_mib = 4096;  // bytes of snapshot files the directory may hold (MiB)
  int64_t kv_cache_min_tokens = 512;  // shorter prefixes are not written (prefilling them is cheap)
  std::string api_key_file;
  server::ServerOptions server;
  DraftOptions draft;
};

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

std::string model_id_of(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// What a snapshot file is bound to (SnapshotIdentity): the model file (or HF directory: its files' total
// size and newest mtime), the model's layout, the backend and the prefill schedule (a restore is exact
// only when the steps after it are those a cold prefill runs on the same kind of backend), the context
// size and the chat template.
SnapshotIdentity snapshot_identity(const std::string& model_path, const std::string& model_id, const ModelSpec& spec,
                                   const LoadedModel& model, int64_t n_ctx, uint64_t template_hash) {
  namespace fs = std::filesystem;
  SnapshotIdentity id;
  id.model_id = model_id;
  struct stat st {};
  if (::stat(model_path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    id.model_bytes = static_cast<uint64_t>(st.st_size);
    id.model_mtime = static_cast<int64_t>(st.st_mtime);
  } else {
    std::error_code ec;
    for (fs::directory_iterator it(model_path, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      struct stat fst {};
      if (::stat(it->path().c_str(), &fst) != 0 || !S_ISREG(fst.st_mode)) continue;
      id.model_bytes += static_cast<uint64_t>(fst.st_size);
      id.model_mtime = std::max<int64_t>(id.model_mtime, fst.st_mtime);
    }
  }
  std::string layout =
      fmt::format("prefill schedule v{} (chunk {}, min segment {}); {}; weights {} bytes; backend {}",
                  server::Generation::kPrefillScheduleVersion, model.runner->prefill_chunk(),
                  server::Generation::kMinPrefixSegment, spec.summary(), model.host->bytes(),
                  model.runner->backend().name());
  // A split's files are its placement's: another placement runs other kernels on some layers, so its
  // restores would not be exact (FEATURES.md F3); its files are left to it, not re-bound here.
  if (model.split()) layout += "; placement " + model.placement_name();
  // f16 KV rounds what later layers read: its snapshots are not an f32 run's (f32 keeps the old identity).
  if (model.runner->backend().kv_type() != cpu::KvType::kF32)
    layout += fmt::format("; kv {}", cpu::kv_type_name(model.runner->backend().kv_type()));
  id.layout_hash = XXH3_64bits(layout.data(), layout.size());
  id.n_ctx = n_ctx;
  id.template_hash = template_hash;
  return id;
}

Status serve(ServeOptions opt) {
  DF_RETURN_IF_ERROR(model_or_default("serve", opt.model));
  if (!opt.api_key_file.empty()) {
    DF_ASSIGN_OR_RETURN(std::string key, read_text_file(opt.api_key_file));
    while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ')) key.pop_back();
    if (key.empty()) return invalid_argument("the API key file {} is empty", opt.api_key_file);
    opt.server.api_key = key;
  }
  if (opt.server.port < 0 || opt.server.port > 65535) return invalid_argument("--port must be 0..65535");
  if (opt.server.max_queue < 0) return invalid_argument("--max-queue must be >= 0");
  if (opt.server.parallel < 1 || opt.server.parallel > 64)
    return invalid_argument("--parallel must be 1..64 (got {})", opt.server.parallel);
  if (opt.ctx < 0) return invalid_argument("--ctx must be >= 0");
  DF_RETURN_IF_ERROR(check_placement_flags(opt.where));
  if (opt.prefix_cache_mib < 0 || opt.prefix_cache_mib > (int64_t{1} << 30))
    return invalid_argument("--prefix-cache-mib must be 0 (off) or a size in MiB (got {})", opt.prefix_cache_mib);
  if (!(opt.kv_cache_budget_mib > 0) || opt.kv_cache_budget_mib > double(int64_t{1} << 30))
    return invalid_argument("--kv-cache-budget must be a size in MiB above 0 (got {})", opt.kv_cache_budget_mib);
  if (opt.kv_cache_min_tokens < 1)
    return invalid_argument("--kv-cache-min-tokens must be at least 1 (got {})", opt.kv_cache_min_tokens);
  spdlog::flush_on(spdlog::level::info);  // a server's log is read while it runs
  server::HttpServer http(opt.server);
  DF_RETURN_IF_ERROR(http.start());
  log::info("serve: listening on http://{}:{} (loading {})", opt.server.host, http.port(), opt.model);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);

  const auto t0 = std::chrono::steady_clock::now();
  DF_ASSIGN_OR_RETURN(Tokenizer tok, load_tokenizer(opt.model));
  std::unique_ptr<ChatTemplate> tmpl;
  bool xml_tool_calls = false;
  uint64_t template_hash = 0;  // what snapshot files are bound to: the template's sources and special tokens
  if (auto src = load_chat_template(opt.model); src.ok()) {
    const std::string all = src->source + '\0' + src->tool_use_source + '\0' + src->bos_token + '\0' + src->eos_token;
    template_hash = XXH3_64bits(all.data(), all.size());
    auto t = ChatTemplate::create(*src);
    if (!t.ok()) return t.status();
    tmpl = std::make_unique<ChatTemplate>(std::move(t).value());
    xml_tool_calls = (src->source + src->tool_use_source).find("<function=") != std::string::npos;
  } else {
    log::warn("serve: {} has no chat template ({}); /v1/chat/completions will refuse", opt.model,
              src.status().message());
  }
  DF_ASSIGN_OR_RETURN(LoadedModel model, load_model(opt.model, opt.where, opt.threads));
  const ModelSpec& spec = model.weights().spec();
  if (tok.size() > spec.vocab)
    return invalid_argument("the tokenizer has {} tokens but the model only {}", tok.size(), spec.vocab);
  server::Engine engine;
  DF_ASSIGN_OR_RETURN(std::unique_ptr<ResidentDraft> draft, load_draft(opt.draft, opt.model, model, opt.threads, &engine.spec));
  engine.draft = draft.get();
  server::SpecHistory spec_history;  // the adaptive draft choice, carried from request to request
  engine.spec_history = &spec_history;
  engine.runner = model.runner.get();
  engine.tokenizer = &tok;
  engine.chat_template = tmpl.get();
  engine.xml_tool_calls = xml_tool_calls;
  engine.model_id = model_id_of(opt.model);
  engine.device = model.placement_name();
  for (const ShardPlan& p : model.placement) engine.shard_devices.push_back(p.device);
  engine.version = DFLASH_VERSION;
  const JsonConstraint json_constraint(tok);  // response_format json_object's token table, built once
  engine.json = &json_constraint;
  PrefixCache prefix_cache(static_cast<uint64_t>(opt.prefix_cache_mib) << 20);
  engine.prefix_cache = &prefix_cache;
  const int64_t model_ctx = spec.max_context > 0 ? spec.max_context : 32768;
  engine.n_ctx = opt.ctx > 0 ? std::min(opt.ctx, model_ctx) : std::min<int64_t>(model_ctx, 32768);
  // The disk cache: its directory scanned before the first request, so that it can hit. A directory that
  // cannot be made or read is a warning: the server runs on without it.
  std::unique_ptr<DiskCache> disk_cache;
  if (!opt.kv_cache_dir.empty()) {
    DiskCacheOptions dopt;
    dopt.dir = opt.kv_cache_dir;
    dopt.budget_bytes = static_cast<uint64_t>(opt.kv_cache_budget_mib * double(1 << 20));
    dopt.min_tokens = opt.kv_cache_min_tokens;
    dopt.identity = snapshot_identity(opt.model, engine.model_id, spec, model, engine.n_ctx, template_hash);
    auto dc = DiskCache::open(std::move(dopt));
    if (dc.ok()) {
      disk_cache = std::move(dc).value();
      engine.disk_cache = disk_cache.get();
    } else {
      log::warn("serve: no disk cache: {}", dc.status().message());
    }
  }
  // A device's first request would pay for loading kernels and picking GEMM algorithms (an H100's first
  // 512-token prefill of a Qwen3-8B: 3-4x the next); pay it here, before /health says ready.
  const auto shards = model.runner->shards();
  if (std::any_of(shards.begin(), shards.end(), [](const RunnerShard& s) { return s.backend->device_memory(); })) {
    const auto w0 = std::chrono::steady_clock::now();
    if (Status w = model.runner->warm_up(engine.n_ctx); w.ok())
      log::info("serve: warmed up the step shapes in {:.2f} s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
    else
      log::warn("serve: warm-up failed ({}); the first request will pay for it", w.message());
  }
  http.set_engine(&engine);
  log::info("serve: {} ready on {} in {:.1f} s ({}; context {} tokens, {} slot{}; prefix cache {}; disk cache {}; "
            "draft {})",
            engine.model_id, model.placement_name(),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), spec.summary(), engine.n_ctx,
            opt.server.parallel, opt.server.parallel == 1 ? "" : "s",
            opt.prefix_cache_mib > 0 ? fmt::format("{} MiB", opt.prefix_cache_mib) : std::string("off"),
            disk_cache ? fmt::format("{}, {:.0f} MiB, from {} tokens", disk_cache->dir(), opt.kv_cache_budget_mib,
                                     opt.kv_cache_min_tokens)
                       : std::string("off"),
            draft ? draft->path() : std::string("none"));
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  log::info("serve: shutting down");
  http.set_engine(nullptr);  // ends the generations: their snapshots are queued for the disk
  http.stop();
  if (disk_cache) disk_cache->stop();  // the write in progress, and queued ones for a moment
  return Status();
}

}  // namespace

void add_serve_command(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  cmd->add_option("model,--model,-m", opt->model, model_option_help());
  cmd->add_option("--host", opt->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", opt->server.port, "Port (0: any free port)")->capture_default_str();
  add_placement_flags(cmd, &opt->where);
  cmd->add_option("--threads,-t", opt->threads, "CPU threads (default: all cores)");
  cmd->add_option("--ctx", opt->ctx, "Context tokens per request (default: the model's, at most 32768)");
  auto* key = cmd->add_option("--api-key", opt->server.api_key, "Require this key (Authorization: Bearer KEY)");
  cmd->add_option("--api-key-file", opt->api_key_file, "Read the required key from a file")->excludes(key);
  cmd->add_option("--cors", opt->server.cors_origin, "Access-Control-Allow-Origin value (e.g. *)");
  cmd->add_option("--parallel", opt->server.parallel,
                  "Slots: requests generating at once, interleaved a token at a time (1..64)")
      ->capture_default_str();
  cmd->add_option("--prefix-cache-mib", opt->prefix_cache_mib,
                  "Host memory (MiB) for snapshots of prompt prefixes taken at chat turn boundaries; 0: off")
      ->capture_default_str();
  cmd->add_option("--kv-cache-dir", opt->kv_cache_dir,
                  "Directory of prefix snapshot files: written after responses, restored after a restart");
  cmd->add_option("--kv-cache-budget", opt->kv_cache_budget_mib,
                  "MiB of snapshot files (of this model) the --kv-cache-dir may hold")
      ->capture_default_str();
  cmd->add_option("--kv-cache-min-tokens", opt->kv_cache_min_tokens,
                  "Prefixes shorter than this are not written to --kv-cache-dir")
      ->capture_default_str();
  cmd->add_option("--max-queue", opt->server.max_queue, "Requests that may wait for a slot; more get 503")
      ->capture_default_str();
  cmd->add_option("--max-body", opt->server.max_body_bytes, "Request body limit in bytes")->capture_default_str();
  cmd->add_option("--timeout", opt->server.request_timeout_s, "Seconds a request may take")->capture_default_str();
  add_draft_options(cmd, opt->draft);
  cmd->callback([opt, &exit_code] {
    Status st = serve(*opt);
    exit_code = st.ok() ? 0 : report(st);
  });
}

}  // namespace dflash::cli
