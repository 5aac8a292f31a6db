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
        const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
        if (j.is_object() && j.contains("name") && j["name"].is_string()) {
          ToolCall call;
          call.id = id_prefix_ + std::to_string(calls_++);
          call.name = j["name"].get<std::string>();
          const auto args = j.find("arguments");
          if (args == j.end() || args->is_null()) call.arguments = "{}";
          else if (args->is_string()) call.arguments = args->get<std::string>();
          else call.arguments = args->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
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
