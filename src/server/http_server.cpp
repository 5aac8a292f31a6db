#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "server/openai_api.h"
#include "server/responses_api.h"
#include "server/scheduler.h"

namespace dflash::server {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr int64_t kDefaultMaxTokens = 4096;

// Text from clients and models may hold invalid UTF-8: it is replaced (U+FFFD), never an exception.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const Status& st, int status = 0) {
  send_json(res, status != 0 ? status : http_status_for(st), error_body(st));
}

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

// What the scheduler thread hands a request's HTTP thread: text deltas in order, then the outcome. The
// scheduler only appends and notifies, so a slow client never stalls it; the deltas held are at most the
// text of the request's max_tokens tokens (bounded by the context): one delta a token at most, and the
// held-back tail at the end.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> deltas;
  std::optional<Result<GenerationResult>> result;
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);

  // The job's sink (streams only) and completion, both called on the scheduler thread.
  bool push(std::string_view delta) {
    {
      std::lock_guard<std::mutex> lock(mu);
      deltas.emplace_back(delta);
    }
    cv.notify_one();
    return !cancel->load();
  }
  void finish(Result<GenerationResult> r) {
    {
      std::lock_guard<std::mutex> lock(mu);
      result.emplace(std::move(r));
    }
    cv.notify_one();
  }
};

}  // namespace

struct HttpServer::Impl {
  ServerOptions opt;
  httplib::Server http;
  std::thread thread;
  std::atomic<const Engine*> engine{nullptr};
  std::atomic<uint64_t> next_id{1};
  socket_t listen_socket = -1;  // set when httplib makes it (its accept backlog of 5 is raised after bind)
  // /metrics counters.
  std::atomic<uint64_t> requests{0}, completed{0}, failed{0}, prompt_tokens{0}, cached_tokens{0}, generated_tokens{0},
      prefill_us{0}, decode_us{0};
  // Speculative decoding: the acceptance counters of finished requests, summed.
  std::mutex spec_mu;
  SpecStats spec_total;
  int64_t spec_requests = 0, spec_ar_tokens = 0;
  // The slots generations run in (made with the engine, stopped when it goes); handlers hold a
  // reference while they submit.
  std::mutex scheduler_mu;
  std::shared_ptr<Scheduler> scheduler;

  std::shared_ptr<Scheduler> current_scheduler() {
    std::lock_guard<std::mutex> lock(scheduler_mu);
    return scheduler;
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (opt.api_key.empty()) return true;
    const std::string want = "Bearer " + opt.api_key;
    if (req.get_header_value("Authorization") == want || req.get_header_value("X-Api-Key") == opt.api_key) return true;
    send_json(res, 401,
              json{{"error",
                    {{"message", "missing or wrong API key (Authorization: Bearer KEY)"},
                     {"type", "authentication_error"},
                     {"param", nullptr},
                     {"code", "invalid_api_key"}}}});
    return false;
  }

  const Engine* ready(httplib::Response& res) {
    const Engine* e = engine.load();
    if (e == nullptr) {
      res.set_header("Retry-After", "5");
      send_json(res, 503, json{{"error", {{"message", "the model is loading"}, {"type", "unavailable"},
                                          {"param", nullptr}, {"code", nullptr}}}});
    }
    return e;
  }

  // How a route words its output: the whole response; for streams the opening events, the events of a
  // piece of text, and the closing events (held-back text, finish, usage) of a finished generation.
  struct Shapes {
    std::function<json(const GenerationResult&)> full;
    std::vector<json> first;
    std::function<std::vector<json>(const std::string& delta)> delta;
    std::function<std::vector<json>(const GenerationResult&)> finish;
    bool named_events = false;  // "event: <type>" lines (the Responses API)
    bool done_marker = true;    // "data: [DONE]" at the end (chat and completions)
  };

  // A plain (not streamed) response still running after kPlainKeepalive: the JSON body goes out chunked,
  // preceded by one space per kPlainKeepalive while the generation runs (JSON allows leading whitespace).
  // cpp-httplib 0.11 tells a handler nothing of a client that hangs up; a write to its socket fails, and
  // the failure cancels the request, which frees its slot at the scheduler's next step. The status is
  // then 200 whatever the outcome: a failure is an OpenAI error body, as in a stream.
  static constexpr std::chrono::seconds kPlainKeepalive{1};
  void serve_plain_keepalive(httplib::Response& res, const std::shared_ptr<Channel>& ch,
                             const std::shared_ptr<Shapes>& shapes, const std::string& id) {
    res.set_chunked_content_provider("application/json", [this, ch, shapes, id](size_t, httplib::DataSink& sink) {
      for (;;) {
        std::optional<Result<GenerationResult>> r;
        {
          std::unique_lock<std::mutex> lock(ch->mu);
          ch->cv.wait_for(lock, kPlainKeepalive, [&] { return ch->result.has_value(); });
          r.swap(ch->result);
        }
        if (!r) {
          if (sink.write(" ", 1)) continue;
          ch->cancel->store(true);  // the scheduler drops it at its next step
          log::info("request {}: the client went away", id);
          failed.fetch_add(1);
          return false;
        }
        std::string body;
        if (r->ok()) {
          finished(id, **r);
          body = dump(shapes->full(**r));
        } else {
          log::info("request {}: {}", id, r->status().to_string());
          failed.fetch_add(1);
          body = dump(error_body(r->status()));
        }
        sink.write(body.data(), body.size());
        sink.done();
        return true;
      }
    },
    // Whether or not the provider ran: a generation nobody will read stops.
    [ch](bool) { ch->cancel->store(true); });
  }

  // Checks the request against the context, then runs it plainly or as a server-sent event stream.
  void serve_generation(httplib::Response& res, const Engine& e, GenerationRequest gen, bool stream,
                        const std::string& id, std::chrono::steady_clock::time_point arrived, Shapes shapes,
                        int64_t default_max) {
    const auto n_prompt = static_cast<int64_t>(gen.prompt.size());
    if (n_prompt == 0) return send_error(res, invalid_argument("the prompt is empty"));
    if (n_prompt >= e.n_ctx)
      return send_error(res, invalid_argument("the prompt has {} tokens; the context holds {}", n_prompt, e.n_ctx));
    if (gen.max_tokens < 0) gen.max_tokens = std::min(default_max, e.n_ctx - n_prompt);
    if (n_prompt + gen.max_tokens > e.n_ctx)
      return send_error(res, invalid_argument("the prompt ({} tokens) plus max_tokens ({}) exceed the context of {}",
                                              n_prompt, gen.max_tokens, e.n_ctx));
    const auto deadline = arrived + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                        std::chrono::duration<double>(opt.request_timeout_s));
    // The generation runs on the scheduler's thread; this thread waits for its text and its outcome.
    auto ch = std::make_shared<Channel>();
    GenerationJob job;
    job.request = std::move(gen);
    if (stream) job.sink = [ch](std::string_view delta) { return ch->push(delta); };
    job.cancel = ch->cancel;
    job.deadline = deadline;
    job.done = [ch](Result<GenerationResult> r) { ch->finish(std::move(r)); };
    const std::shared_ptr<Scheduler> sched = current_scheduler();
    const auto admission = sched ? sched->submit(std::move(job)) : Scheduler::Admission::kStopped;
    if (admission == Scheduler::Admission::kFull) return busy(res);
    if (admission == Scheduler::Admission::kStopped) return unavailable(res, "the server is shutting down");
    if (!stream) {
      {
        std::unique_lock<std::mutex> lock(ch->mu);
        if (ch->cv.wait_for(lock, kPlainKeepalive, [&] { return ch->result.has_value(); })) {
          const Result<GenerationResult>& r = *ch->result;
          if (!r.ok()) return send_error(res, r.status());
          finished(id, *r);
          return send_json(res, 200, shapes.full(*r));
        }
      }
      return serve_plain_keepalive(res, ch, std::make_shared<Shapes>(std::move(shapes)), id);
    }
    auto sh = std::make_shared<Shapes>(std::move(shapes));
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, ch, sh, id](size_t, httplib::DataSink& sink) {
          auto send = [&sink, &sh](const json& j) {
            std::string line;
            if (sh->named_events && j.contains("type") && j["type"].is_string())
              line = "event: " + j["type"].get<std::string>() + "\n";
            line += "data: " + dump(j) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          bool ok = true;
          for (const json& j : sh->first) ok = ok && send(j);
          for (;;) {
            std::deque<std::string> deltas;
            std::optional<Result<GenerationResult>> r;
            {
              std::unique_lock<std::mutex> lock(ch->mu);
              ch->cv.wait(lock, [&] { return !ch->deltas.empty() || ch->result.has_value(); });
              deltas.swap(ch->deltas);
              r.swap(ch->result);  // every delta of the generation came before its outcome
            }
            for (const std::string& delta : deltas)
              for (const json& chunk : sh->delta(delta)) ok = ok && send(chunk);
            if (!ok) r = Status(ErrorCode::kCancelled, "the client went away");
            if (!r) continue;
            if (!r->ok()) {
              ch->cancel->store(true);  // the scheduler drops it at its next step (if it still runs)
              if (ok) send(error_body(r->status()));
              log::info("request {}: {}", id, r->status().to_string());
              failed.fetch_add(1);
              sink.done();
              return true;
            }
            for (const json& j : sh->finish(**r)) send(j);
            if (sh->done_marker) {
              const std::string done = "data: [DONE]\n\n";
              sink.write(done.data(), done.size());
            }
            finished(id, **r);
            sink.done();
            return true;
          }
        },
        // Whether or not the provider ran (a client gone before the headers): the generation stops.
        [ch](bool) { ch->cancel->store(true); });
  }

  // A chat request made ready to run: the rendered prompt's ids (with a forced tool-call opening when
  // tool_choice asks for one) and how to split the output.
  struct PreparedChat {
    std::string forced;
    bool in_reasoning = false;
    bool use_tools = false;
  };
  // Tools go to the template unless tool_choice is none.
  static bool uses_tools(const ChatRequest& cr) { return !cr.tools.is_null() && cr.tool_choice != "none"; }

  // The prompt a chat request renders to (what /apply-template returns).
  static Result<std::string> render_prompt(const Engine& e, const ChatRequest& cr) {
    if (e.chat_template == nullptr) return unsupported("the model has no chat template; use /v1/completions");
    return e.chat_template->render(cr.messages, uses_tools(cr) ? cr.tools : ojson(), true, cr.template_kwargs);
  }

  Result<PreparedChat> prepare_chat(const Engine& e, ChatRequest& cr) {
    PreparedChat p;
    // Required / a named function start the assistant turn with the call's opening so the model
    // continues a call (forced, not sampled).
    p.use_tools = uses_tools(cr);
    // json_object: the reply is the object alone, so no tool calls and no thinking before it.
    if (cr.gen.json_object && p.use_tools)
      return field_error("response_format", "json_object cannot be combined with tools (unless tool_choice is none)");
    if (cr.gen.json_object) cr.template_kwargs["enable_thinking"] = false;
    DF_ASSIGN_OR_RETURN(std::string prompt, render_prompt(e, cr));
    if (p.use_tools && cr.tool_choice == "required") p.forced = "<tool_call>\n";
    if (p.use_tools && cr.tool_choice == "function")  // the model's own call syntax (Qwen3.5 XML or Qwen3 JSON)
      p.forced = e.xml_tool_calls ? "<tool_call>\n<function=" + cr.tool_name + ">\n"
                     : "<tool_call>\n{\"name\": " + json(cr.tool_name).dump() + ", \"arguments\": ";
    std::string trimmed = prompt;
    while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == ' ')) trimmed.pop_back();
    p.in_reasoning = trimmed.size() >= 7 && trimmed.compare(trimmed.size() - 7, 7, "<think>") == 0;
    // A forced call cannot start inside an open think block (Qwen3.5's prompt ends in "<think>\n"): close it.
    if (!p.forced.empty() && p.in_reasoning) p.forced = "</think>\n\n" + p.forced;
    // Likewise a JSON reply from a template that opens a think block regardless of enable_thinking.
    if (cr.gen.json_object && p.in_reasoning) p.forced = "</think>\n\n";
    DF_ASSIGN_OR_RETURN(cr.gen.prompt, e.tokenizer->encode(prompt + p.forced, true));
    return p;
  }

  void chat_completions(const httplib::Request& req, httplib::Response& res) {
    requests.fetch_add(1);
    if (!authorized(req, res)) return;
    const Engine* e = ready(res);
    if (e == nullptr) return;
    const auto arrived = std::chrono::steady_clock::now();
    auto parsed = parse_chat_request(req.body, e->n_ctx);
    if (!parsed.ok()) return send_error(res, parsed.status());
    ChatRequest cr = std::move(parsed).value();
    auto prep = prepare_chat(*e, cr);
    if (!prep.ok()) return send_error(res, prep.status());
    const std::string forced = prep->forced;
    const std::string id = fmt::format("chatcmpl-{}-{}", unix_now(), next_id.fetch_add(1));
    const int64_t created = unix_now();
    const std::string model = e->model_id;
    const bool include_usage = cr.include_usage;
    // One splitter per request: reasoning, content and tool calls out of the raw text.
    auto split = std::make_shared<OutputSplitter>(prep->in_reasoning, prep->use_tools,
                                                  fmt::format("call_{}_", next_id.load()));
    auto sent_calls = std::make_shared<int>(0);
    auto chunks_of = [=](const OutputDelta& d) {
      std::vector<json> out;
      for (json& delta : delta_objects(d, *sent_calls)) out.push_back(chat_chunk(id, model, created, delta));
      *sent_calls += static_cast<int>(d.tool_calls.size());
      return out;
    };
    auto finish_of = [split](const std::string& f) {
      return f == "stop" && split->tool_call_count() > 0 ? std::string("tool_calls") : f;
    };
    Shapes shapes;
    shapes.full = [=](const GenerationResult& r) {
      OutputDelta d = split->push(forced + r.text);
      d.append(split->finish());
      json c = chat_completion(id, model, created, r, assistant_message(d), finish_of(r.finish_reason));
      c["choices"][0]["logprobs"] = logprobs_of(r, *e->tokenizer);
      return c;
    };
    shapes.first = {chat_chunk(id, model, created, json{{"role", "assistant"}, {"content", ""}})};
    shapes.delta = [=](const std::string& text) { return chunks_of(split->push(text)); };
    shapes.finish = [=](const GenerationResult& r) {
      std::vector<json> out = chunks_of(split->finish());
      json fin = chat_chunk(id, model, created, json::object(), finish_of(r.finish_reason));
      if (!r.logprobs.empty()) fin["choices"][0]["logprobs"] = logprobs_of(r, *e->tokenizer);
      out.push_back(fin);
      if (include_usage) {
        json u = chat_chunk(id, model, created, json::object());
        u["choices"] = json::array();
        u["usage"] = usage_of(r);
        u["timings"] = timings_of(r);
        out.push_back(u);
      }
      return out;
    };
    if (!forced.empty() && cr.stream) split->push(forced);  // the forced opening is not sent as text
    serve_generation(res, *e, std::move(cr.gen), cr.stream, id, arrived, std::move(shapes), kDefaultMaxTokens);
  }

  void responses(const httplib::Request& req, httplib::Response& res) {
    requests.fetch_add(1);
    if (!authorized(req, res)) return;
    const Engine* e = ready(res);
    if (e == nullptr) return;
    const auto arrived = std::chrono::steady_clock::now();
    auto parsed = parse_responses_request(req.body, e->n_ctx);
    if (!parsed.ok()) return send_error(res, parsed.status());
    ResponsesRequest rr = std::move(parsed).value();
    auto prep = prepare_chat(*e, rr.chat);
    if (!prep.ok()) return send_error(res, prep.status());
    const std::string forced = prep->forced;
    const std::string id = fmt::format("resp_{}_{}", unix_now(), next_id.fetch_add(1));
    const int64_t created = unix_now();
    const std::string model = e->model_id;
    const json echo = rr.echo;
    auto split = std::make_shared<OutputSplitter>(prep->in_reasoning, prep->use_tools, "call_" + id + "_");
    auto events = std::make_shared<ResponseEvents>(id, model, created, echo);
    auto all = std::make_shared<OutputDelta>();
    Shapes shapes;
    shapes.full = [=](const GenerationResult& r) {
      OutputDelta d = split->push(forced + r.text);
      d.append(split->finish());
      return response_object(id, model, created, echo, r, d, r.finish_reason == "length" ? "incomplete" : "completed");
    };
    shapes.first = events->start();
    shapes.delta = [=](const std::string& text) {
      const OutputDelta d = split->push(text);
      all->append(d);
      return events->delta(d);
    };
    shapes.finish = [=](const GenerationResult& r) {
      const OutputDelta d = split->finish();
      all->append(d);
      std::vector<json> out = events->delta(d);
      for (json& j : events->finish(r, *all)) out.push_back(std::move(j));
      return out;
    };
    shapes.named_events = true;
    shapes.done_marker = false;
    if (!forced.empty() && rr.chat.stream) split->push(forced);
    serve_generation(res, *e, std::move(rr.chat.gen), rr.chat.stream, id, arrived, std::move(shapes),
                     kDefaultMaxTokens);
  }

  void completions(const httplib::Request& req, httplib::Response& res) {
    requests.fetch_add(1);
    if (!authorized(req, res)) return;
    const Engine* e = ready(res);
    if (e == nullptr) return;
    const auto arrived = std::chrono::steady_clock::now();
    auto parsed = parse_completion_request(req.body, e->n_ctx);
    if (!parsed.ok()) return send_error(res, parsed.status());
    CompletionRequest cr = std::move(parsed).value();
    if (cr.has_ids) {
      cr.gen.prompt = std::move(cr.prompt_ids);
    } else {
      auto ids = e->tokenizer->encode(cr.prompt_text, true);
      if (!ids.ok()) return send_error(res, ids.status());
      cr.gen.prompt = std::move(ids).value();
    }
    const std::string id = fmt::format("cmpl-{}-{}", unix_now(), next_id.fetch_add(1));
    const int64_t created = unix_now();
    const std::string model = e->model_id;
    const bool include_usage = cr.include_usage;
    Shapes shapes;
    shapes.full = [=](const GenerationResult& r) { return text_completion(id, model, created, r); };
    shapes.delta = [=](const std::string& d) { return std::vector<json>{text_chunk(id, model, created, d)}; };
    shapes.finish = [=](const GenerationResult& r) {
      std::vector<json> out = {text_chunk(id, model, created, "", r.finish_reason)};
      if (include_usage) {
        json u = text_chunk(id, model, created, "");
        u["choices"] = json::array();
        u["usage"] = usage_of(r);
        out.push_back(u);
      }
      return out;
    };
    serve_generation(res, *e, std::move(cr.gen), cr.stream, id, arrived, std::move(shapes), 16);
  }

  void busy(httplib::Response& res) { unavailable(res, "the server is busy: the request queue is full"); }

  void unavailable(httplib::Response& res, const std::string& why) {
    res.set_header("Retry-After", "1");
    send_json(res, 503, json{{"error", {{"message", why}, {"type", "unavailable"}, {"param", nullptr}, {"code", nullptr}}}});
  }

  void finished(const std::string& id, const GenerationResult& r) {
    completed.fetch_add(1);
    prompt_tokens.fetch_add(static_cast<uint64_t>(r.prompt_tokens));
    cached_tokens.fetch_add(static_cast<uint64_t>(r.cached_tokens));
    generated_tokens.fetch_add(static_cast<uint64_t>(r.completion_tokens));
    prefill_us.fetch_add(static_cast<uint64_t>(r.prefill_ms * 1e3));
    decode_us.fetch_add(static_cast<uint64_t>(r.decode_ms * 1e3));
    if (r.speculative) {
      std::lock_guard<std::mutex> lock(spec_mu);
      spec_total.add(r.spec);
      ++spec_requests;
      spec_ar_tokens += r.ar_tokens;
      log::info("request {}: speculative: {} steps, drafted {}, accepted {} ({:.2f} tokens per step), {} plain tokens",
                id, r.spec.steps, r.spec.drafted, r.spec.accepted,
                r.spec.steps > 0 ? static_cast<double>(r.spec.accepted + r.spec.steps) / r.spec.steps : 0.0, r.ar_tokens);
    }
    log::info("request {}: prompt {} tokens (cached {}{}), generated {}, prefill {:.1f} ms, decode {:.1f} ms, finish {}",
              id, r.prompt_tokens, r.cached_tokens,
              r.cached_tokens > 0 ? fmt::format(": {}_hit=true restore=true pos={}", r.disk_hit ? "disk" : "memory",
                                                r.cached_tokens)
                                  : "",
              r.completion_tokens, r.prefill_ms, r.decode_ms, r.finish_reason);
  }

  // The prefix caches' part of /props: memory, and the disk (disk_* fields; zero when it is off).
  static json cache_props(const Engine& e) {
    const PrefixCache* c = e.prefix_cache;
    const PrefixCacheStats st = c != nullptr ? c->stats() : PrefixCacheStats();
    const DiskCacheStats ds = e.disk_cache != nullptr ? e.disk_cache->stats() : DiskCacheStats();
    return json{{"prefix_cache", c != nullptr && c->enabled()},
                {"disk_cache", e.disk_cache != nullptr},
                {"capacity_bytes", st.capacity},
                {"used_bytes", st.bytes},
                {"entries", st.entries},
                {"hits", st.hits},
                {"misses", st.misses},
                {"disk_capacity_bytes", ds.budget},
                {"disk_used_bytes", ds.bytes},
                {"disk_entries", ds.entries},
                {"disk_hits", ds.hits},
                {"disk_misses", ds.misses},
                {"disk_writes", ds.writes},
                {"disk_write_errors", ds.write_errors},
                {"disk_evictions", ds.evictions},
                {"disk_dropped", ds.dropped},
                {"disk_removed_bad", ds.removed_bad},
                {"disk_pending", ds.pending},
                {"disk_writable", ds.writable},
                {"disk_min_tokens", e.disk_cache != nullptr ? e.disk_cache->min_tokens() : 0}};
  }

  // /props runtime.placement: the target's shards in layer order, with the memory each one's backend holds.
  json placement_props(const Engine& e) {
    json shards = json::array();
    const auto sh = e.runner->shards();
    for (size_t i = 0; i < sh.size(); ++i) {
      const MemoryStats m = sh[i].backend->memory_stats();
      shards.push_back({{"device", i < e.shard_devices.size() ? e.shard_devices[i] : sh[i].backend->name()},
                        {"layers", {sh[i].layer_begin, sh[i].layer_end}},
                        {"weight_bytes", sh[i].weights->shard_bytes(sh[i].layer_begin, sh[i].layer_end)},
                        {"memory_live_bytes", m.buffers_live},
                        {"memory_peak_bytes", m.buffers_peak}});
    }
    const HandoffStats h = e.runner->handoff_stats();
    return {{"shards", shards}, {"handoffs", h.count}, {"handoff_bytes", h.bytes}, {"handoff_ms", h.ms}};
  }

  // /props "speculative": the draft, how requests draft with it, and the acceptance so far.
  json speculative_props(const Engine& e) {
    if (e.draft == nullptr) return json{{"enabled", false}};
    const ModelSpec& d = e.draft->spec();
    std::lock_guard<std::mutex> lock(spec_mu);
    const ResidentDraft::Stats rs = e.draft->stats();
    return json{{"enabled", true},
                {"draft", e.draft->path()},
                {"draft_summary", d.summary()},
                {"block_size", d.block_size},
                {"target_layer_ids", d.target_layer_ids},
                {"mode", e.spec.ddtree ? "ddtree" : "chain"},
                {"ddtree_budget", e.spec.ddtree_budget},
                {"adaptive", e.spec.adaptive},
                {"parked", rs.parked},
                {"unparks", rs.unparks},
                {"last_unpark_ms", rs.last_unpark_ms},
                {"draft_bytes", rs.weight_bytes},
                {"resident_bytes", rs.resident_bytes},
                {"requests", spec_requests},
                {"steps", spec_total.steps},
                {"drafted", spec_total.drafted},
                {"accepted", spec_total.accepted},
                {"plain_tokens", spec_ar_tokens},
                {"mean_acceptance_length",
                 spec_total.steps > 0 ? static_cast<double>(spec_total.accepted + spec_total.steps) / spec_total.steps : 0.0},
                {"accepted_at", spec_total.accepted_at}};
  }

  void routes() {
    // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which lets a second server bind a port
    // that is in use instead of failing.
    http.set_socket_options([this](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
      listen_socket = sock;
    });
    http.set_payload_max_length(opt.max_body_bytes);
    // Every request in a slot or waiting for one holds a connection thread (streams for their whole
    // length): enough threads for the slots, a full queue, and a few for /health, /metrics and refusals,
    // so that admitted requests are never starved of a thread (httplib's default is 8).
    const size_t threads = static_cast<size_t>(std::min<int64_t>(opt.max_queue, 1024) + opt.parallel) + 16;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    if (!opt.cors_origin.empty()) {
      http.set_default_headers({{"Access-Control-Allow-Origin", opt.cors_origin},
                                {"Access-Control-Allow-Headers", "Authorization, Content-Type, X-Api-Key"},
                                {"Access-Control-Allow-Methods", "GET, POST, OPTIONS"}});
      http.Options(R"(.*)", [](const httplib::Request&, httplib::Response& res) { res.status = 204; });
    }
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (engine.load() == nullptr) return send_json(res, 503, json{{"status", "loading"}});
      send_json(res, 200, json{{"status", "ok"}});
    });
    http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      const Engine* e = ready(res);
      if (e == nullptr) return;
      send_json(res, 200, json{{"object", "list"},
                               {"data", json::array({{{"id", e->model_id},
                                                      {"object", "model"},
                                                      {"created", 0},
                                                      {"owned_by", "dflash"},
                                                      {"meta", {{"n_ctx", e->n_ctx}}}}})}});
    });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { chat_completions(req, res); });
    http.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) { responses(req, res); });
    http.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { completions(req, res); });
    http.Get("/props", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      const Engine* e = ready(res);
      if (e == nullptr) return;
      send_json(res, 200,
                json{{"model", e->model_id},
                     {"n_ctx", e->n_ctx},
                     {"total_slots", opt.parallel},
                     {"default_generation_settings",
                      {{"temperature", 1.0}, {"top_p", 1.0}, {"top_k", 0}, {"min_p", 0.0}, {"max_tokens", kDefaultMaxTokens}}},
                     {"chat_template", e->chat_template != nullptr},
                     {"runtime",
                      {{"backend", e->runner->backend().name()},
                       {"devices", e->shard_devices.empty() ? json::array({e->device}) : json(e->shard_devices)},
                       {"placement", placement_props(*e)},
                       {"draft_residency", e->draft != nullptr ? draft_residency_name(e->draft->policy()) : "none"},
                       {"lazy_draft", e->draft != nullptr && e->draft->policy() == DraftResidency::kRequestScoped},
                       {"kv_type", cpu::kv_type_name(e->runner->backend().kv_type())},
                       {"prefill_chunk", e->runner->prefill_chunk()}}},
                     {"speculative", speculative_props(*e)},
                     {"cache", cache_props(*e)},
                     {"limits", {{"max_queue", opt.max_queue}, {"max_body_bytes", opt.max_body_bytes},
                                 {"request_timeout_s", opt.request_timeout_s}}},
                     {"build", {{"version", e->version}}}});
    });
    http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      int64_t busy_slots = 0, waiting = 0;
      if (const std::shared_ptr<Scheduler> sched = current_scheduler()) {
        busy_slots = sched->busy();
        waiting = sched->waiting();
      }
      std::string m;
      auto metric = [&m](const char* name, const char* type, const char* help, double v) {
        m += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
      };
      metric("dflash_requests_total", "counter", "Generation requests received.", static_cast<double>(requests.load()));
      metric("dflash_requests_completed_total", "counter", "Generation requests completed.",
             static_cast<double>(completed.load()));
      metric("dflash_requests_failed_total", "counter", "Streamed generations that failed or were cancelled.",
             static_cast<double>(failed.load()));
      metric("dflash_queue_depth", "gauge", "Requests admitted and not finished (running + waiting).",
             static_cast<double>(busy_slots + waiting));
      metric("dflash_queue_waiting", "gauge", "Requests waiting for a free slot.", static_cast<double>(waiting));
      metric("dflash_slots_busy", "gauge", "Slots running a generation.", static_cast<double>(busy_slots));
      metric("dflash_slots_total", "gauge", "Slots (--parallel): generations interleaved step by step.",
             static_cast<double>(opt.parallel));
      metric("dflash_prompt_tokens_total", "counter", "Prompt tokens processed.",
             static_cast<double>(prompt_tokens.load()));
      metric("dflash_prompt_cached_tokens_total", "counter", "Prompt tokens restored from the prefix cache.",
             static_cast<double>(cached_tokens.load()));
      const Engine* e = engine.load();
      const PrefixCacheStats pc =
          e != nullptr && e->prefix_cache != nullptr ? e->prefix_cache->stats() : PrefixCacheStats();
      metric("dflash_prefix_cache_hits_total", "counter", "Prompts that restored a cached prefix.",
             static_cast<double>(pc.hits));
      metric("dflash_prefix_cache_misses_total", "counter", "Prompts that found no cached prefix.",
             static_cast<double>(pc.misses));
      metric("dflash_prefix_cache_entries", "gauge", "Snapshots in the prefix cache.", static_cast<double>(pc.entries));
      metric("dflash_prefix_cache_bytes", "gauge", "Host bytes the prefix cache holds.", static_cast<double>(pc.bytes));
      metric("dflash_prefix_cache_capacity_bytes", "gauge", "The prefix cache's budget (--prefix-cache-mib).",
             static_cast<double>(pc.capacity));
      const DiskCacheStats dc = e != nullptr && e->disk_cache != nullptr ? e->disk_cache->stats() : DiskCacheStats();
      metric("dflash_disk_cache_hits_total", "counter", "Prompts that restored a snapshot file (--kv-cache-dir).",
             static_cast<double>(dc.hits));
      metric("dflash_disk_cache_misses_total", "counter", "Prompts that found no cached prefix in memory or on disk.",
             static_cast<double>(dc.misses));
      metric("dflash_disk_cache_writes_total", "counter", "Snapshot files written.", static_cast<double>(dc.writes));
      metric("dflash_disk_cache_write_errors_total", "counter", "Snapshot writes that failed (writing then stops).",
             static_cast<double>(dc.write_errors));
      metric("dflash_disk_cache_evictions_total", "counter", "Snapshot files removed to stay within the budget.",
             static_cast<double>(dc.evictions));
      metric("dflash_disk_cache_entries", "gauge", "Snapshot files of this model in the cache directory.",
             static_cast<double>(dc.entries));
      metric("dflash_disk_cache_bytes", "gauge", "Bytes of those files.", static_cast<double>(dc.bytes));
      metric("dflash_disk_cache_budget_bytes", "gauge", "The disk cache's budget (--kv-cache-budget).",
             static_cast<double>(dc.budget));
      metric("dflash_generated_tokens_total", "counter", "Tokens generated.", static_cast<double>(generated_tokens.load()));
      metric("dflash_prefill_seconds_total", "counter", "Time spent in prefill.", prefill_us.load() / 1e6);
      metric("dflash_decode_seconds_total", "counter", "Time spent decoding.", decode_us.load() / 1e6);
      {
        std::lock_guard<std::mutex> lock(spec_mu);
        metric("dflash_spec_steps_total", "counter", "Speculative steps (draft + verify).",
               static_cast<double>(spec_total.steps));
        metric("dflash_spec_drafted_tokens_total", "counter", "Drafted tokens put to the target.",
               static_cast<double>(spec_total.drafted));
        metric("dflash_spec_accepted_tokens_total", "counter", "Drafted tokens the target kept.",
               static_cast<double>(spec_total.accepted));
        metric("dflash_spec_plain_tokens_total", "counter",
               "Tokens decoded one at a time by requests with a draft (adaptive fallback).",
               static_cast<double>(spec_ar_tokens));
        m += "# HELP dflash_spec_accepted_at_total Steps that kept the drafted token at each depth.\n"
             "# TYPE dflash_spec_accepted_at_total counter\n";
        for (size_t d = 0; d < spec_total.accepted_at.size(); ++d)
          m += fmt::format("dflash_spec_accepted_at_total{{depth=\"{}\"}} {}\n", d + 1, spec_total.accepted_at[d]);
      }
      metric("dflash_model_loaded", "gauge", "1 once the model serves requests.", engine.load() != nullptr ? 1 : 0);
      res.status = 200;
      res.set_content(m, "text/plain; version=0.0.4");
    });
    // Drops every prefix snapshot in memory (requests restoring one now keep theirs); with {"disk": true}
    // also removes this model's snapshot files (writes still queued happen afterwards).
    http.Post("/cache/clear", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      const Engine* e = ready(res);
      if (e == nullptr) return;
      bool disk = false;
      if (!req.body.empty()) {
        const json body = json::parse(req.body, nullptr, false);
        if (!body.is_object()) return send_error(res, invalid_argument("the body must be a JSON object"));
        if (body.contains("disk")) {
          if (!body["disk"].is_boolean()) return send_error(res, field_error("disk", "'disk' must be true or false"));
          disk = body["disk"].get<bool>();
        }
      }
      const int64_t n = e->prefix_cache != nullptr ? e->prefix_cache->clear() : 0;
      const int64_t d = disk && e->disk_cache != nullptr ? e->disk_cache->clear() : 0;
      log::info("prefix cache: cleared {} snapshots{}", n, disk ? fmt::format(" and {} snapshot files", d) : "");
      send_json(res, 200, json{{"cleared", n}, {"disk_cleared", d}});
    });
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      const Engine* e = ready(res);
      if (e == nullptr) return;
      json body = json::parse(req.body, nullptr, false);
      if (!body.is_object() || !body.contains("content") || !body["content"].is_string())
        return send_error(res, invalid_argument("'content' must be a string"));
      const bool special = body.value("add_special", false);
      auto ids = e->tokenizer->encode(body["content"].get<std::string>(), special);
      if (!ids.ok()) return send_error(res, ids.status());
      send_json(res, 200, json{{"tokens", *ids}});
    });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      const Engine* e = ready(res);
      if (e == nullptr) return;
      json body = json::parse(req.body, nullptr, false);
      if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array())
        return send_error(res, invalid_argument("'tokens' must be an array of token ids"));
      std::vector<int32_t> ids;
      for (const auto& t : body["tokens"]) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= e->tokenizer->size())
          return send_error(res, invalid_argument("'tokens' holds an id outside the vocabulary"));
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      send_json(res, 200, json{{"content", e->tokenizer->decode_text(ids, false)}});
    });
    http.Post("/apply-template", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      const Engine* e = ready(res);
      if (e == nullptr) return;
      auto parsed = parse_chat_request(req.body, e->n_ctx);
      if (!parsed.ok()) return send_error(res, parsed.status());
      auto prompt = render_prompt(*e, *parsed);
      if (!prompt.ok()) return send_error(res, prompt.status());
      send_json(res, 200, json{{"prompt", *prompt}});
    });
    http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      const Status st = res.status == 404   ? not_found("no such route")
                        : res.status == 413 ? invalid_argument("the request body is too large")
                                            : invalid_argument("bad request");
      res.set_content(dump(error_body(st)), "application/json");
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
      send_json(res, 500, error_body(internal_error("the request failed inside the server")));
    });
  }
};

HttpServer::HttpServer(ServerOptions opt) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(opt);
  impl_->opt.parallel = std::max(impl_->opt.parallel, 1);
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  impl_->routes();
  if (impl_->opt.port == 0) {
    port_ = impl_->http.bind_to_any_port(impl_->opt.host);
    if (port_ <= 0) return io_error("cannot listen on {} (any port)", impl_->opt.host);
  } else {
    if (!impl_->http.bind_to_port(impl_->opt.host, impl_->opt.port))
      return io_error("cannot listen on {}:{} (in use, or not an address of this machine)", impl_->opt.host,
                      impl_->opt.port);
    port_ = impl_->opt.port;
  }
  // httplib listens with a backlog of 5: a burst of clients overflows it and connections get reset.
  // listen() again on the bound socket raises it (Linux updates the backlog of a listening socket).
  if (impl_->listen_socket >= 0) ::listen(impl_->listen_socket, 1024);
  impl_->thread = std::thread([this] { impl_->http.listen_after_bind(); });
  return Status();
}

void HttpServer::set_engine(const Engine* engine) {
  std::shared_ptr<Scheduler> old;
  {
    std::lock_guard<std::mutex> lock(impl_->scheduler_mu);
    old = std::move(impl_->scheduler);
    if (engine != nullptr)
      impl_->scheduler = std::make_shared<Scheduler>(*engine, impl_->opt.parallel, impl_->opt.max_queue);
    impl_->engine.store(engine);
  }
  // Cancels the old engine's requests and frees its sequences before the caller may destroy it.
  if (old) old->stop();
}

void HttpServer::stop() {
  if (!impl_) return;
  std::shared_ptr<Scheduler> sched;
  {
    std::lock_guard<std::mutex> lock(impl_->scheduler_mu);
    sched = std::move(impl_->scheduler);
  }
  if (sched) sched->stop();  // running requests end (cancelled), so their connection threads are free
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace dflash::server
