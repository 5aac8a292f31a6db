#include "server/output_parser.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace dflash::server {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";

// Length of the longest suffix of s that is a proper prefix of tag.
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t k = std::min(tag.size() - 1, s.size()); k > 0; --k)
    if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
  return 0;
}

std::string_view trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\n' || v.front() == '\r' || v.front() == '\t'))
    v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\n' || v.back() == '\r' || v.back() == '\t')) v.remove_suffix(1);
  return v;
}

// Qwen3.5 / Qwen3-Coder form: <function=NAME> <parameter=KEY>VALUE</parameter> ... </function>. A value
// that parses as JSON (number, object, ...) keeps its type; anything else is a string (one newline on each
// side dropped).
bool parse_xml_call(std::string_view body, std::string* name, nlohmann::ordered_json* args) {
  body = trim(body);
  constexpr std::string_view kFn = "<function=", kFnEnd = "</function>", kP = "<parameter=", kPEnd = "</parameter>";
  if (body.substr(0, kFn.size()) != kFn || body.size() < kFnEnd.size() ||
      body.substr(body.size() - kFnEnd.size()) != kFnEnd)
    return false;
  const size_t gt = body.find('>');
  *name = std::string(trim(body.substr(kFn.size(), gt - kFn.size())));
  if (name->empty()) return false;
  std::string_view rest = body.substr(gt + 1, body.size() - kFnEnd.size() - gt - 1);
  *args = nlohmann::ordered_json::object();
  for (;;) {
    rest = trim(rest);
    if (rest.empty()) return true;
    if (rest.substr(0, kP.size()) != kP) return false;
    const size_t pgt = rest.find('>');
    const size_t end = rest.find(kPEnd);
    if (pgt == std::string_view::npos || end == std::string_view::npos || end < pgt) return false;
    const std::string key(trim(rest.substr(kP.size(), pgt - kP.size())));
    std::string_view value = rest.substr(pgt + 1, end - pgt - 1);
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(value, nullptr, false);
    (*args)[key] = parsed.is_discarded() || parsed.is_string() ? nlohmann::ordered_json(std::string(value)) : parsed;
    rest = rest.substr(end + kPEnd.size());
  }
}

}  // namespace

OutputSplitter::OutputSplitter(bool in_reasoning, bool parse_tools, std::string id_prefix)
    : state_(in_reasoning ? State::kReasoning : State::kStart),
      parse_tools_(parse_tools),
      id_prefix_(std::move(id_prefix)) {}

OutputDelta OutputSplitter::push(std::string_view text) {
  buf_.append(text);
  OutputDelta out;
  run(out, false);
  return out;
}

OutputDelta OutputSplitter::finish() {
  OutputDelta out;
  run(out, true);
  return out;
}

void OutputSplitter::run(OutputDelta& out, bool final) {
  for (;;) {
    switch (state_) {
      case State::kStart: {
        // Leading whitespace, then "<think>" opens reasoning; anything else is content. Whitespace is
        // held only briefly: a model that only prints newlines must still stream.
        constexpr size_t kMaxLeadingWhitespace = 16;
        const size_t ws = buf_.find_first_not_of(" \t\r\n");
        if (ws == std::string::npos) {
          if (!final && buf_.size() <= kMaxLeadingWhitespace) return;
          state_ = State::kContent;
          break;
        }
        const std::string_view rest = std::string_view(buf_).substr(ws);
        if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
          buf_.erase(0, ws + kThinkOpen.size());
          state_ = State::kReasoning;
          break;
        }
        if (!final && rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest) return;
        state_ = State::kContent;
        break;
      }
      case State::kReasoning: {
        const size_t at = buf_.find(kThinkClose);
        if (at != std::string::npos) {
          out.reasoning += buf_.substr(0, at);
          buf_.erase(0, at + kThinkClose.size());
          state_ = State::kContent;
          trim_newlines_ = true;
          break;
        }
        const size_t keep = final ? 0 : partial_tag(buf_, kThinkClose);
        out.reasoning += buf_.substr(0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::kContent: {
        if (trim_newlines_) {
          const size_t nl = buf_.find_first_not_of("\r\n");
          if (nl == std::string::npos) {
            buf_.clear();
            if (final) trim_newlines_ = false;
            return;
          }
          buf_.erase(0, nl);
          trim_newlines_ = false;
        }
        if (parse_tools_) {
          const size_t at = buf_.find(kToolOpen);
          if (at != std::string::npos) {
            out.content += buf_.substr(0, at);
            buf_.erase(0, at + kToolOpen.size());
            state_ = State::kToolCall;
            break;
          }
        }
        const size_t keep = final || !parse_tools_ ? 0 : partial_tag(buf_, kToolOpen);
        out.content += buf_.substr(0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::kToolCall: {
        const size_t at = buf_.find(kToolClose);
        if (at == std::string::npos) {
          if (!final) return;
          out.content += std::string(kToolOpen) + buf_;  // never closed: it was text
          buf_.clear();
          state_ = State::kContent;
          return;
        }
        const std::string body = buf_.substr(0, at);
        buf_.erase(0, at + kToolClose.size());
        state_ = State::kContent;
        const nlohmann::ordered_json j = nlohmann::ordered_json::parse(body, nullptr, false);
        std::string xml_name;
        nlohmann::ordered_json xml_args;
        const bool json_call = j.is_object() && j.contains("name") && j["name"].is_string();
        if (json_call || parse_xml_call(body, &xml_name, &xml_args)) {
          ToolCall call;
          call.id = id_prefix_ + std::to_string(calls_++);
          if (json_call) {
            call.name = j["name"].get<std::string>();
            const auto args = j.find("arguments");
            if (args == j.end() || args->is_null()) call.arguments = "{}";
            else if (args->is_string()) call.arguments = args->get<std::string>();
            else call.arguments = args->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
          } else {
            call.name = xml_name;
            call.arguments = xml_args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
          }
          out.tool_calls.push_back(std::move(call));
          trim_newlines_ = true;  // the newline between consecutive calls
        } else {
          out.content += std::string(kToolOpen) + body + std::string(kToolClose);
        }
        break;
      }
    }
  }
}

}  // namespace dflash::server
