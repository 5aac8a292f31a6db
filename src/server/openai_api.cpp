#include "server/openai_api.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <limits>

namespace dflash::server {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;


// A number field in [lo, hi] (finite), or absent.
Status number_in(const ojson& body, const char* key, double lo, double hi, float* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return Status();
  if (!it->is_number()) return field_error(key, "must be a number");
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) return field_error(key, fmt::format("must be between {} and {}", lo, hi));
  *out = static_cast<float>(v);
  return Status();
}

Result<std::string> content_text(const ojson& content, size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return field_error(param, "must be a string or an array of content parts");
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const ojson& part = content[k];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return field_error(fmt::format("{}[{}]", param, k), "must be an object with a string 'type'");
    const std::string type = part["type"].get<std::string>();
    if (type != "text")
      return field_error(fmt::format("{}[{}].type", param, k), fmt::format("'{}' is not supported (text only)", type));
    if (!part.contains("text") || !part["text"].is_string())
      return field_error(fmt::format("{}[{}].text", param, k), "must be a string");
    text += part["text"].get<std::string>();
  }
  return text;
}

// The body as a JSON object, and its optional string "model".
Result<ojson> parse_body(const std::string& text, std::string* model) {
  ojson body;
  try {
    body = ojson::parse(text);
  } catch (const std::exception& e) {
    return invalid_argument("the body is not valid JSON: {}", e.what());
  }
  if (!body.is_object()) return invalid_argument("the body must be a JSON object");
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return field_error("model", "must be a string");
    *model = it->get<std::string>();
  }
  return body;
}

// response_format: {"type": "text"} (the default) or {"type": "json_object"} (output constrained to one
// JSON object: decode/json_constraint.h). json_schema is refused until schemas are enforced: accepting it
// and checking nothing would hand back output that does not match.
Status parse_response_format(const ojson& body, bool* json_object) {
  auto rf = body.find("response_format");
  if (rf == body.end() || rf->is_null()) return Status();
  if (!rf->is_object())
    return field_error("response_format", "must be an object: {\"type\": \"text\"} or {\"type\": \"json_object\"}");
  auto type = rf->find("type");
  if (type == rf->end() || !type->is_string())
    return field_error("response_format", "needs a string 'type': text or json_object");
  const std::string t = type->get<std::string>();
  if (t == "text") return Status();
  if (t == "json_object") {
    *json_object = true;
    return Status();
  }
  if (t == "json_schema")
    return field_error("response_format", "type 'json_schema' is not supported yet; use {\"type\": \"json_object\"} "
                                          "(any JSON object) and describe the schema in the prompt");
  return field_error("response_format", fmt::format("type '{}' is not one of text, json_object", t));
}

// Fields every generating route shares: sampling, length, stop strings, stream options, and the refusals
// of what is not implemented yet.
Status parse_common(const ojson& body, int64_t n_ctx, GenerationRequest& gen, bool& stream, bool& include_usage) {
  // Fields not implemented yet: refused rather than ignored.
  if (body.contains("functions") && !body["functions"].is_null())
    return unsupported("'functions' (the legacy form) is not supported; use 'tools'");
  if (auto lp = body.find("logprobs"); lp != body.end() && !lp->is_null()) {
    if (!lp->is_boolean()) return field_error("logprobs", "must be a boolean");
    if (lp->get<bool>()) gen.top_logprobs = 0;
  }
  if (auto tl = body.find("top_logprobs"); tl != body.end() && !tl->is_null()) {
    if (!tl->is_number_integer() || tl->get<int64_t>() < 0 || tl->get<int64_t>() > 20)
      return field_error("top_logprobs", "must be an integer from 0 to 20");
    if (gen.top_logprobs < 0) return field_error("top_logprobs", "needs 'logprobs': true");
    gen.top_logprobs = static_cast<int>(tl->get<int64_t>());
  }
  if (auto n = body.find("n"); n != body.end() && !n->is_null()) {
    if (!n->is_number_integer() || n->get<int64_t>() != 1) return field_error("n", "must be 1");
  }
  // Stream.
  if (auto s = body.find("stream"); s != body.end() && !s->is_null()) {
    if (!s->is_boolean()) return field_error("stream", "must be a boolean");
    stream = s->get<bool>();
  }
  if (auto so = body.find("stream_options"); so != body.end() && !so->is_null()) {
    if (!so->is_object()) return field_error("stream_options", "must be an object");
    if (auto iu = so->find("include_usage"); iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) return field_error("stream_options.include_usage", "must be a boolean");
      include_usage = iu->get<bool>();
    }
  }
  // Sampling.
  SamplingParams& sp = gen.sampling;
  sp.temperature = 1.0f;  // OpenAI's default
  DF_RETURN_IF_ERROR(number_in(body, "temperature", 0.0, 2.0, &sp.temperature));
  DF_RETURN_IF_ERROR(number_in(body, "top_p", 0.0, 1.0, &sp.top_p));
  if (sp.top_p == 0.0f) return field_error("top_p", "must be greater than 0");
  DF_RETURN_IF_ERROR(number_in(body, "min_p", 0.0, 1.0, &sp.min_p));
  DF_RETURN_IF_ERROR(number_in(body, "presence_penalty", -2.0, 2.0, &sp.presence_penalty));
  DF_RETURN_IF_ERROR(number_in(body, "frequency_penalty", -2.0, 2.0, &sp.frequency_penalty));
  DF_RETURN_IF_ERROR(number_in(body, "repetition_penalty", 0.01, 10.0, &sp.repetition_penalty));
  if (auto k = body.find("top_k"); k != body.end() && !k->is_null()) {
    if (!k->is_number_integer() || k->get<int64_t>() < 0 || k->get<int64_t>() > (1 << 30))
      return field_error("top_k", "must be a non-negative integer");
    sp.top_k = static_cast<int32_t>(k->get<int64_t>());
  }
  // logit_bias: {"token id": bias in [-100, 100]}, added to the logit; -100 bans the token (OpenAI's
  // meaning). Ids are checked against the vocabulary when the request starts.
  if (auto lb = body.find("logit_bias"); lb != body.end() && !lb->is_null()) {
    if (!lb->is_object()) return field_error("logit_bias", "must be an object mapping token ids to biases");
    if (lb->size() > 1024) return field_error("logit_bias", "has more than 1024 entries");
    for (const auto& [key, v] : lb->items()) {
      int32_t id = 0;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (key.empty() || ec != std::errc() || end != key.data() + key.size() || id < 0)
        return field_error("logit_bias", fmt::format("key '{}' is not a token id", key.substr(0, 32)));
      if (!v.is_number() || v.get<double>() < -100.0 || v.get<double>() > 100.0)
        return field_error("logit_bias", "values must be numbers from -100 to 100");
      const double b = v.get<double>();
      sp.logit_bias[id] = b <= -100.0 ? -std::numeric_limits<float>::infinity() : static_cast<float>(b);
    }
  }
  if (auto seed = body.find("seed"); seed != body.end() && !seed->is_null()) {
    if (!seed->is_number_integer()) return field_error("seed", "must be an integer");
    sp.seed = static_cast<uint64_t>(seed->get<int64_t>());
  }
  // Length.
  int64_t max_tokens = -1;
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < 1) return field_error(key, "must be a positive integer");
    if (it->get<int64_t>() > n_ctx) return field_error(key, fmt::format("exceeds the context of {} tokens", n_ctx));
    max_tokens = it->get<int64_t>();
    break;
  }
  gen.max_tokens = max_tokens;  // -1: the server fills in what the context leaves
  // Stop strings.
  if (auto st = body.find("stop"); st != body.end() && !st->is_null()) {
    if (st->is_string()) {
      gen.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (st->size() > 4) return field_error("stop", "takes at most 4 strings");
      for (const auto& s : *st) {
        if (!s.is_string()) return field_error("stop", "must be a string or an array of strings");
        gen.stop.push_back(s.get<std::string>());
      }
    } else {
      return field_error("stop", "must be a string or an array of strings");
    }
  }
  return sp.validate();
}

}  // namespace

Status field_error(const std::string& param, const std::string& what) {
  return invalid_argument("'{}' {}", param, what);
}

int http_status_for(const Status& st) {
  switch (st.code()) {
    case ErrorCode::kOk: return 200;
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kCorrupt: return 400;
    case ErrorCode::kNotFound: return 404;
    case ErrorCode::kUnsupported: return 400;
    case ErrorCode::kCancelled: return 408;
    default: return 500;
  }
}

json error_body(const Status& st, const std::string& param) {
  const int code = http_status_for(st);
  const char* type = code == 404 ? "not_found_error" : code < 500 ? "invalid_request_error" : "server_error";
  // Without an explicit param, a client error that opens with a quoted field name (field_error's
  // "'param' what") names that field, as OpenAI's "param" does.
  std::string named = param;
  if (named.empty() && code < 500 && st.message().size() > 2 && st.message()[0] == '\'') {
    const size_t close = st.message().find('\'', 1);
    if (close != std::string::npos && close > 1) named = st.message().substr(1, close - 1);
  }
  return json{{"error",
               {{"message", st.message()},
                {"type", type},
                {"param", named.empty() ? json(nullptr) : json(named)},
                {"code", nullptr}}}};
}

Result<ChatRequest> parse_chat_request(const std::string& body_text, int64_t n_ctx) {
  ChatRequest req;
  DF_ASSIGN_OR_RETURN(ojson body, parse_body(body_text, &req.model));
  // Messages.
  auto msgs = body.find("messages");
  if (msgs == body.end() || !msgs->is_array() || msgs->empty()) return field_error("messages", "must be a non-empty array");
  req.messages = ojson::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& m = (*msgs)[i];
    if (!m.is_object()) return field_error(fmt::format("messages[{}]", i), "must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return field_error(fmt::format("messages[{}].role", i), "must be a string");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      return field_error(fmt::format("messages[{}].role", i), fmt::format("'{}' is not one of system, developer, user, "
                                                                  "assistant, tool", r));
    DF_ASSIGN_OR_RETURN(std::string text, content_text(m.contains("content") ? m["content"] : ojson(), i));
    ojson msg = {{"role", r}, {"content", text}};
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
      const std::string param = fmt::format("messages[{}].tool_calls", i);
      if (r != "assistant") return field_error(param, "belongs to assistant messages");
      if (!tc->is_array()) return field_error(param, "must be an array");
      ojson calls = ojson::array();
      for (size_t k = 0; k < tc->size(); ++k) {
        const ojson& c = (*tc)[k];
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object() ||
            !c["function"].contains("name") || !c["function"]["name"].is_string())
          return field_error(fmt::format("{}[{}]", param, k), "must be {\"type\": \"function\", \"function\": {\"name\", "
                                                     "\"arguments\"}}");
        ojson fn = {{"name", c["function"]["name"]}};
        // Templates print a mapping with tojson; clients send arguments as a JSON string.
        const ojson args = c["function"].contains("arguments") ? c["function"]["arguments"] : ojson::object();
        if (args.is_string()) {
          ojson parsed = ojson::parse(args.get<std::string>(), nullptr, false);
          fn["arguments"] = parsed.is_discarded() ? args : parsed;
        } else {
          fn["arguments"] = args;
        }
        ojson call = {{"type", "function"}, {"function", fn}};
        if (c.contains("id") && c["id"].is_string()) call["id"] = c["id"];
        calls.push_back(call);
      }
      msg["tool_calls"] = calls;
    }
    if (auto id = m.find("tool_call_id"); id != m.end() && id->is_string()) msg["tool_call_id"] = *id;
    if (auto nm = m.find("name"); nm != m.end() && nm->is_string()) msg["name"] = *nm;
    req.messages.push_back(std::move(msg));
  }
  // Tools.
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return field_error("tools", "must be an array");
    for (size_t k = 0; k < tools->size(); ++k) {
      const ojson& t = (*tools)[k];
      if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
          !t["function"].is_object() || !t["function"].contains("name") || !t["function"]["name"].is_string())
        return field_error(fmt::format("tools[{}]", k), "must be {\"type\": \"function\", \"function\": {\"name\", ...}}");
      if (t["function"].contains("parameters") && !t["function"]["parameters"].is_object())
        return field_error(fmt::format("tools[{}].function.parameters", k), "must be a JSON schema object");
    }
    if (!tools->empty()) req.tools = *tools;
  }
  if (auto tc = body.find("tool_choice"); tc != body.end() && !tc->is_null()) {
    if (tc->is_string()) {
      const std::string c = tc->get<std::string>();
      if (c != "auto" && c != "none" && c != "required") return field_error("tool_choice", "must be auto, none, required or "
                                                                               "{\"type\": \"function\", ...}");
      req.tool_choice = c;
    } else if (tc->is_object() && tc->contains("function") && (*tc)["function"].is_object() &&
               (*tc)["function"].contains("name") && (*tc)["function"]["name"].is_string()) {
      req.tool_choice = "function";
      req.tool_name = (*tc)["function"]["name"].get<std::string>();
      bool known = false;
      for (const auto& t : req.tools) known = known || t["function"]["name"] == req.tool_name;
      if (!known) return field_error("tool_choice", fmt::format("names '{}', which is not in 'tools'", req.tool_name));
    } else {
      return field_error("tool_choice", "must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\"}}");
    }
    if (req.tool_choice != "auto" && req.tool_choice != "none" && req.tools.is_null())
      return field_error("tool_choice", "needs 'tools'");
  }
  DF_RETURN_IF_ERROR(parse_common(body, n_ctx, req.gen, req.stream, req.include_usage));
  DF_RETURN_IF_ERROR(parse_response_format(body, &req.gen.json_object));
  // Template arguments.
  if (auto kw = body.find("chat_template_kwargs"); kw != body.end() && !kw->is_null()) {
    if (!kw->is_object()) return field_error("chat_template_kwargs", "must be an object");
    req.template_kwargs = *kw;
  }
  if (auto re = body.find("reasoning_effort"); re != body.end() && !re->is_null()) {
    if (!re->is_string()) return field_error("reasoning_effort", "must be a string");
    const std::string effort = re->get<std::string>();
    if (effort != "none" && effort != "minimal" && effort != "low" && effort != "medium" && effort != "high")
      return field_error("reasoning_effort", "must be none, minimal, low, medium or high");
    if (!req.template_kwargs.contains("enable_thinking"))
      req.template_kwargs["enable_thinking"] = effort != "none" && effort != "minimal";
  }
  return req;
}

Result<CompletionRequest> parse_completion_request(const std::string& body_text, int64_t n_ctx) {
  CompletionRequest req;
  DF_ASSIGN_OR_RETURN(ojson body, parse_body(body_text, &req.model));
  auto p = body.find("prompt");
  if (p == body.end() || p->is_null()) return field_error("prompt", "is required");
  if (p->is_string()) {
    req.prompt_text = p->get<std::string>();
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    req.prompt_text = (*p)[0].get<std::string>();
  } else if (p->is_array() && !p->empty() && std::all_of(p->begin(), p->end(), [](const ojson& v) {
               return v.is_number_integer();
             })) {
    for (const auto& v : *p) {
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id > INT32_MAX) return field_error("prompt", "holds a token id out of range");
      req.prompt_ids.push_back(static_cast<int32_t>(id));
    }
    req.has_ids = true;
  } else {
    return field_error("prompt", "must be a string, an array of one string, or an array of token ids");
  }
  if (body.contains("tools") && !body["tools"].is_null()) return unsupported("'tools' belong to chat completions");
  if (auto lp = body.find("logprobs"); lp != body.end() && !lp->is_null())
    return unsupported("'logprobs' on /v1/completions (the legacy integer form) is not supported; use chat");
  for (const char* key : {"echo", "suffix"})
    if (body.contains(key) && !body[key].is_null() && !(body[key].is_boolean() && !body[key].get<bool>()))
      return unsupported("'{}' is not supported yet", key);
  if (auto bo = body.find("best_of"); bo != body.end() && !bo->is_null() && (!bo->is_number_integer() || *bo != 1))
    return field_error("best_of", "must be 1");
  DF_RETURN_IF_ERROR(parse_common(body, n_ctx, req.gen, req.stream, req.include_usage));
  DF_RETURN_IF_ERROR(parse_response_format(body, &req.gen.json_object));
  if (req.gen.max_tokens < 0) req.gen.max_tokens = 16;  // OpenAI's default for completions
  return req;
}

json text_completion(const std::string& id, const std::string& model, int64_t created, const GenerationResult& r) {
  return json{{"id", id},
              {"object", "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({{{"index", 0},
                                        {"text", r.text},
                                        {"logprobs", nullptr},
                                        {"finish_reason", r.finish_reason}}})},
              {"usage", usage_of(r)},
              {"timings", timings_of(r)}};
}

json text_chunk(const std::string& id, const std::string& model, int64_t created, const std::string& text,
                const std::string& finish_reason) {
  return json{{"id", id},
              {"object", "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({{{"index", 0},
                                        {"text", text},
                                        {"logprobs", nullptr},
                                        {"finish_reason", finish_reason.empty() ? json(nullptr)
                                                                                : json(finish_reason)}}})}};
}

json usage_of(const GenerationResult& r) {
  json u{{"prompt_tokens", r.prompt_tokens},
         {"completion_tokens", r.completion_tokens},
         {"total_tokens", r.prompt_tokens + r.completion_tokens},
         {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
  if (r.speculative) {
    // OpenAI's field for predicted outputs, and the DFlash acceptance in detail.
    u["completion_tokens_details"] = {{"accepted_prediction_tokens", r.spec.accepted},
                                      {"rejected_prediction_tokens", r.spec.drafted - r.spec.accepted}};
    u["speculative"] = {{"steps", r.spec.steps},
                        {"drafted", r.spec.drafted},
                        {"accepted", r.spec.accepted},
                        {"acceptance_length", r.spec.steps > 0
                                                  ? static_cast<double>(r.spec.accepted + r.spec.steps) / r.spec.steps
                                                  : 0.0},
                        {"accepted_at", r.spec.accepted_at},
                        {"plain_tokens", r.ar_tokens}};
  }
  return u;
}

// As llama.cpp's server: prompt_n counts the prompt tokens evaluated, cache_n those restored from the cache.
json timings_of(const GenerationResult& r) {
  const int64_t evaluated = r.prompt_tokens - r.cached_tokens;
  return json{{"cache_n", r.cached_tokens},
              {"prompt_n", evaluated},
              {"prompt_ms", r.prefill_ms},
              {"prompt_per_second", r.prefill_ms > 0 ? evaluated * 1e3 / r.prefill_ms : 0.0},
              {"predicted_n", r.completion_tokens},
              {"predicted_ms", r.decode_ms},
              {"predicted_per_second", r.decode_ms > 0 ? r.completion_tokens * 1e3 / r.decode_ms : 0.0},
              {"draft_n", r.spec.drafted},
              {"draft_n_accepted", r.spec.accepted}};
}

json chat_completion(const std::string& id, const std::string& model, int64_t created, const GenerationResult& r) {
  return chat_completion(id, model, created, r, json{{"role", "assistant"}, {"content", r.text}}, r.finish_reason);
}

json chat_completion(const std::string& id, const std::string& model, int64_t created, const GenerationResult& r,
                     const json& message, const std::string& finish_reason) {
  return json{{"id", id},
              {"object", "chat.completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({{{"index", 0},
                                        {"message", message},
                                        {"logprobs", nullptr},
                                        {"finish_reason", finish_reason}}})},
              {"usage", usage_of(r)},
              {"timings", timings_of(r)}};
}

json logprobs_of(const GenerationResult& r, const Tokenizer& tok) {
  if (r.logprobs.empty()) return nullptr;
  auto entry = [&tok](int32_t id, float lp) {
    std::string bytes;
    tok.append_token_bytes(id, false, bytes);
    json b = json::array();
    for (unsigned char c : bytes) b.push_back(static_cast<int>(c));
    const int32_t one[] = {id};
    return json{{"token", tok.decode_text(one, false)}, {"logprob", lp}, {"bytes", b}};
  };
  json content = json::array();
  for (const TokenLogprob& t : r.logprobs) {
    json e = entry(t.id, t.logprob);
    e["top_logprobs"] = json::array();
    for (const auto& [id, lp] : t.top) e["top_logprobs"].push_back(entry(id, lp));
    content.push_back(std::move(e));
  }
  return json{{"content", content}};
}

json assistant_message(const OutputDelta& d) {
  json m = {{"role", "assistant"}, {"content", d.content.empty() && !d.tool_calls.empty() ? json(nullptr)
                                                                                         : json(d.content)}};
  if (!d.reasoning.empty()) m["reasoning_content"] = d.reasoning;
  if (!d.tool_calls.empty()) {
    m["tool_calls"] = json::array();
    for (const auto& c : d.tool_calls)
      m["tool_calls"].push_back(
          {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return m;
}

std::vector<json> delta_objects(const OutputDelta& d, int first_index) {
  std::vector<json> out;
  if (!d.reasoning.empty()) out.push_back({{"reasoning_content", d.reasoning}});
  if (!d.content.empty()) out.push_back({{"content", d.content}});
  for (size_t k = 0; k < d.tool_calls.size(); ++k) {
    const auto& c = d.tool_calls[k];
    out.push_back({{"tool_calls", json::array({{{"index", first_index + static_cast<int>(k)},
                                                {"id", c.id},
                                                {"type", "function"},
                                                {"function", {{"name", c.name}, {"arguments", c.arguments}}}}})}});
  }
  return out;
}

json chat_chunk(const std::string& id, const std::string& model, int64_t created, const json& delta,
                const std::string& finish_reason) {
  return json{{"id", id},
              {"object", "chat.completion.chunk"},
              {"created", created},
              {"model", model},
              {"choices", json::array({{{"index", 0},
                                        {"delta", delta},
                                        {"logprobs", nullptr},
                                        {"finish_reason", finish_reason.empty() ? json(nullptr)
                                                                                : json(finish_reason)}}})}};
}

}  // namespace dflash::server
