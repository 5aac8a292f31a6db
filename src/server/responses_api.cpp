#include "server/responses_api.h"

namespace dflash::server {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;


// Text of an input item's content: a string or input_text / output_text parts.
Result<std::string> item_text(const ojson& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return field_error(param, "must be a string or an array of input_text parts");
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const ojson& p = content[k];
    const std::string type = p.is_object() && p.contains("type") && p["type"].is_string() ? p["type"].get<std::string>()
                                                                                        : "";
    if ((type != "input_text" && type != "output_text" && type != "text") || !p.contains("text") || !p["text"].is_string())
      return field_error(fmt::format("{}[{}]", param, k), "must be {\"type\": \"input_text\", \"text\": ...} (text only)");
    text += p["text"].get<std::string>();
  }
  return text;
}

json usage_object(const GenerationResult& r) {
  return json{{"input_tokens", r.prompt_tokens},
              {"input_tokens_details", {{"cached_tokens", r.cached_tokens}}},
              {"output_tokens", r.completion_tokens},
              {"output_tokens_details", {{"reasoning_tokens", 0}}},
              {"total_tokens", r.prompt_tokens + r.completion_tokens}};
}

json message_item(const std::string& id, const std::string& text, const std::string& status) {
  return json{{"type", "message"},
              {"id", id},
              {"status", status},
              {"role", "assistant"},
              {"content", json::array({{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}}})}};
}

json reasoning_item(const std::string& id, const std::string& text) {
  return json{{"type", "reasoning"},
              {"id", id},
              {"summary", json::array()},
              {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

json call_item(const ToolCall& c) {
  return json{{"type", "function_call"}, {"id", "fc_" + c.id}, {"call_id", c.id}, {"name", c.name},
              {"arguments", c.arguments}, {"status", "completed"}};
}

}  // namespace

Result<ResponsesRequest> parse_responses_request(const std::string& body_text, int64_t n_ctx) {
  ojson body = ojson::parse(body_text, nullptr, false);
  if (body.is_discarded()) return invalid_argument("the body is not valid JSON");
  if (!body.is_object()) return invalid_argument("the body must be a JSON object");
  if (body.contains("previous_response_id") && !body["previous_response_id"].is_null())
    return unsupported("'previous_response_id': this server keeps no responses; send the whole conversation");
  // Build the equivalent chat request and let the chat parser validate everything it shares.
  ojson chat = ojson::object();
  ojson messages = ojson::array();
  if (auto ins = body.find("instructions"); ins != body.end() && !ins->is_null()) {
    if (!ins->is_string()) return field_error("instructions", "must be a string");
    messages.push_back({{"role", "system"}, {"content", *ins}});
  }
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) return field_error("input", "is required");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    for (size_t i = 0; i < input->size(); ++i) {
      const ojson& it = (*input)[i];
      const std::string param = fmt::format("input[{}]", i);
      if (!it.is_object()) return field_error(param, "must be an object");
      const std::string type = it.contains("type") && it["type"].is_string() ? it["type"].get<std::string>() : "message";
      if (type == "message") {
        if (!it.contains("role") || !it["role"].is_string()) return field_error(param + ".role", "must be a string");
        DF_ASSIGN_OR_RETURN(std::string text, item_text(it.contains("content") ? it["content"] : ojson(""),
                                                        param + ".content"));
        messages.push_back({{"role", it["role"]}, {"content", text}});
      } else if (type == "function_call") {
        if (!it.contains("name") || !it["name"].is_string() || !it.contains("call_id") || !it["call_id"].is_string())
          return field_error(param, "needs string 'name' and 'call_id'");
        const ojson args = it.contains("arguments") ? it["arguments"] : ojson("{}");
        ojson call = {{"id", it["call_id"]}, {"type", "function"},
                      {"function", {{"name", it["name"]}, {"arguments", args}}}};
        if (!messages.empty() && messages.back()["role"] == "assistant" && messages.back().contains("tool_calls")) {
          messages.back()["tool_calls"].push_back(call);
        } else {
          messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}});
        }
      } else if (type == "function_call_output") {
        if (!it.contains("call_id") || !it["call_id"].is_string()) return field_error(param + ".call_id", "must be a string");
        std::string out;
        if (it.contains("output") && it["output"].is_string()) out = it["output"].get<std::string>();
        else if (it.contains("output")) out = it["output"].dump();
        messages.push_back({{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", out}});
      } else if (type == "reasoning") {
        continue;  // earlier reasoning is not fed back
      } else {
        return field_error(param + ".type", fmt::format("'{}' is not supported (message, function_call, "
                                                "function_call_output)", type));
      }
    }
  } else {
    return field_error("input", "must be a string or an array of items");
  }
  chat["messages"] = messages;
  // Flat function tools -> chat tools.
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return field_error("tools", "must be an array");
    ojson ct = ojson::array();
    for (size_t k = 0; k < tools->size(); ++k) {
      const ojson& t = (*tools)[k];
      if (!t.is_object() || t.value("type", "") != "function" || !t.contains("name") || !t["name"].is_string())
        return field_error(fmt::format("tools[{}]", k), "must be {\"type\": \"function\", \"name\": ...} (function tools only)");
      ojson fn = {{"name", t["name"]}};
      for (const char* key : {"description", "parameters", "strict"})
        if (t.contains(key)) fn[key] = t[key];
      ct.push_back({{"type", "function"}, {"function", fn}});
    }
    if (!ct.empty()) chat["tools"] = ct;
  }
  if (auto tc = body.find("tool_choice"); tc != body.end() && !tc->is_null()) {
    if (tc->is_object() && tc->value("type", "") == "function" && tc->contains("name"))
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*tc)["name"]}}}};
    else
      chat["tool_choice"] = *tc;
  }
  for (const char* key : {"temperature", "top_p", "stream", "model", "top_logprobs"})
    if (body.contains(key)) chat[key] = body[key];
  if (body.contains("max_output_tokens")) chat["max_tokens"] = body["max_output_tokens"];
  if (auto r = body.find("reasoning"); r != body.end() && r->is_object() && r->contains("effort"))
    chat["reasoning_effort"] = (*r)["effort"];
  // text.format: {"type": "text"} (the default) or {"type": "json_object"}, passed on as chat's
  // response_format; json_schema is refused until schemas are enforced.
  std::string text_format = "text";
  if (auto t = body.find("text"); t != body.end() && !t->is_null()) {
    if (!t->is_object()) return field_error("text", "must be an object: {\"format\": {\"type\": \"text\"}}");
    if (auto f = t->find("format"); f != t->end() && !f->is_null()) {
      if (!f->is_object() || !f->contains("type") || !(*f)["type"].is_string())
        return field_error("text.format", "must be {\"type\": \"text\"} or {\"type\": \"json_object\"}");
      text_format = (*f)["type"].get<std::string>();
      if (text_format == "json_schema")
        return field_error("text.format", "type 'json_schema' is not supported yet; use {\"type\": \"json_object\"} "
                                          "(any JSON object) and describe the schema in the instructions");
      if (text_format != "text" && text_format != "json_object")
        return field_error("text.format", fmt::format("type '{}' is not one of text, json_object", text_format));
      if (text_format == "json_object") chat["response_format"] = {{"type", "json_object"}};
    }
  }
  auto parsed = parse_chat_request(chat.dump(), n_ctx);
  if (!parsed.ok()) {
    // Name the Responses field, not the chat one it was mapped to.
    std::string msg = parsed.status().message();
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"'max_tokens'", "'max_output_tokens'"},
                                   {"'messages", "'input"}})
      if (auto p = msg.find(from); p != std::string::npos) msg.replace(p, from.size(), to);
    return Status(parsed.status().code(), msg);
  }
  ResponsesRequest req;
  req.chat = std::move(parsed).value();
  req.echo = json{{"instructions", body.contains("instructions") ? json(body["instructions"]) : json(nullptr)},
                  {"tools", body.contains("tools") ? json(body["tools"]) : json::array()},
                  {"tool_choice", body.contains("tool_choice") ? json(body["tool_choice"]) : json("auto")},
                  {"temperature", body.contains("temperature") ? json(body["temperature"]) : json(1.0)},
                  {"top_p", body.contains("top_p") ? json(body["top_p"]) : json(1.0)},
                  {"max_output_tokens", body.contains("max_output_tokens") ? json(body["max_output_tokens"]) : json(nullptr)},
                  {"previous_response_id", nullptr},
                  {"text", {{"format", {{"type", text_format}}}}},
                  {"parallel_tool_calls", true},
                  {"store", false}};
  return req;
}

json response_object(const std::string& id, const std::string& model, int64_t created, const json& echo,
                     const GenerationResult& r, const OutputDelta& out, const std::string& status) {
  json output = json::array();
  if (!out.reasoning.empty()) output.push_back(reasoning_item("rs_" + id, out.reasoning));
  if (!out.content.empty() || out.tool_calls.empty()) output.push_back(message_item("msg_" + id, out.content, status));
  for (const auto& c : out.tool_calls) output.push_back(call_item(c));
  json o = {{"id", id},
            {"object", "response"},
            {"created_at", created},
            {"status", status},
            {"model", model},
            {"output", output},
            {"error", nullptr},
            {"incomplete_details", status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
            {"usage", usage_object(r)},
            {"timings", timings_of(r)}};
  for (const auto& [k, v] : echo.items()) o[k] = v;
  return o;
}

ResponseEvents::ResponseEvents(std::string id, std::string model, int64_t created, json echo)
    : id_(std::move(id)), model_(std::move(model)), created_(created), echo_(std::move(echo)) {}

json ResponseEvents::event(const std::string& type, json body) {
  body["type"] = type;
  body["sequence_number"] = seq_++;
  return body;
}

std::vector<json> ResponseEvents::start() {
  json r = {{"id", id_}, {"object", "response"}, {"created_at", created_}, {"status", "in_progress"},
            {"model", model_}, {"output", json::array()}, {"error", nullptr}, {"incomplete_details", nullptr},
            {"usage", nullptr}};
  for (const auto& [k, v] : echo_.items()) r[k] = v;
  return {event("response.created", {{"response", r}}), event("response.in_progress", {{"response", r}})};
}

std::vector<json> ResponseEvents::close_open() {
  std::vector<json> ev;
  if (open_ == Open::kText) {
    ev.push_back(event("response.output_text.done", {{"item_id", open_item_id_}, {"output_index", open_index_},
                                                     {"content_index", 0}, {"text", open_text_}}));
    ev.push_back(event("response.content_part.done",
                       {{"item_id", open_item_id_}, {"output_index", open_index_}, {"content_index", 0},
                        {"part", {{"type", "output_text"}, {"text", open_text_}, {"annotations", json::array()}}}}));
    ev.push_back(event("response.output_item.done",
                       {{"output_index", open_index_}, {"item", message_item(open_item_id_, open_text_, "completed")}}));
  } else if (open_ == Open::kReasoning) {
    ev.push_back(event("response.reasoning_text.done", {{"item_id", open_item_id_}, {"output_index", open_index_},
                                                        {"content_index", 0}, {"text", open_text_}}));
    ev.push_back(event("response.output_item.done",
                       {{"output_index", open_index_}, {"item", reasoning_item(open_item_id_, open_text_)}}));
  }
  open_ = Open::kNone;
  open_text_.clear();
  return ev;
}

std::vector<json> ResponseEvents::delta(const OutputDelta& d) {
  std::vector<json> ev;
  auto append = [&ev](std::vector<json> more) { ev.insert(ev.end(), more.begin(), more.end()); };
  if (!d.reasoning.empty()) {
    if (open_ != Open::kReasoning) {
      append(close_open());
      open_ = Open::kReasoning;
      open_index_ = next_index_++;
      open_item_id_ = fmt::format("rs_{}_{}", id_, open_index_);
      ev.push_back(event("response.output_item.added",
                         {{"output_index", open_index_}, {"item", reasoning_item(open_item_id_, "")}}));
    }
    open_text_ += d.reasoning;
    ev.push_back(event("response.reasoning_text.delta", {{"item_id", open_item_id_}, {"output_index", open_index_},
                                                         {"content_index", 0}, {"delta", d.reasoning}}));
  }
  if (!d.content.empty()) {
    if (open_ != Open::kText) {
      append(close_open());
      open_ = Open::kText;
      open_index_ = next_index_++;
      open_item_id_ = fmt::format("msg_{}_{}", id_, open_index_);
      json item = message_item(open_item_id_, "", "in_progress");
      item["content"] = json::array();
      ev.push_back(event("response.output_item.added", {{"output_index", open_index_}, {"item", item}}));
      ev.push_back(event("response.content_part.added",
                         {{"item_id", open_item_id_}, {"output_index", open_index_}, {"content_index", 0},
                          {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}}));
    }
    open_text_ += d.content;
    ev.push_back(event("response.output_text.delta", {{"item_id", open_item_id_}, {"output_index", open_index_},
                                                      {"content_index", 0}, {"delta", d.content}}));
  }
  for (const auto& c : d.tool_calls) {
    append(close_open());
    const int index = next_index_++;
    json item = call_item(c);
    ev.push_back(event("response.output_item.added", {{"output_index", index}, {"item", item}}));
    ev.push_back(event("response.function_call_arguments.delta",
                       {{"item_id", item["id"]}, {"output_index", index}, {"delta", c.arguments}}));
    ev.push_back(event("response.function_call_arguments.done",
                       {{"item_id", item["id"]}, {"output_index", index}, {"arguments", c.arguments}}));
    ev.push_back(event("response.output_item.done", {{"output_index", index}, {"item", item}}));
  }
  return ev;
}

std::vector<json> ResponseEvents::finish(const GenerationResult& r, const OutputDelta& all) {
  std::vector<json> ev = close_open();
  const std::string status = r.finish_reason == "length" ? "incomplete" : "completed";
  ev.push_back(event(status == "completed" ? "response.completed" : "response.incomplete",
                     {{"response", response_object(id_, model_, created_, echo_, r, all, status)}}));
  return ev;
}

}  // namespace dflash::server
