// The OpenAI Responses API (/v1/responses) on top of the chat machinery: input items (messages,
// function_call, function_call_output), instructions and flat function tools become a ChatRequest; the
// result becomes a response object with reasoning, message and function_call output items, or a stream
// of response.* events.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "server/openai_api.h"
#include "server/output_parser.h"

namespace dflash::server {

struct ResponsesRequest {
  ChatRequest chat;  // messages, tools (chat form), sampling, stream
  nlohmann::json echo = nlohmann::json::object();  // request fields echoed in the response (instructions, tools...)
};

// Parses a /v1/responses body. previous_response_id and non-function tools are refused (this server keeps
// no responses); max_output_tokens maps to max_tokens; text.format {"type": "json_object"} sets
// chat.gen.json_object ({"type": "text"} is the default; json_schema and other types are a 400 naming
// 'text.format').
Result<ResponsesRequest> parse_responses_request(const std::string& body, int64_t n_ctx);

// The response object for a finished generation split into reasoning / text / tool calls.
nlohmann::json response_object(const std::string& id, const std::string& model, int64_t created,
                               const nlohmann::json& echo, const GenerationResult& r, const OutputDelta& out,
                               const std::string& status);

// Streams: the events, each {"type": ..., "sequence_number": n, ...}.
class ResponseEvents {
 public:
  ResponseEvents(std::string id, std::string model, int64_t created, nlohmann::json echo);
  // response.created, response.in_progress
  std::vector<nlohmann::json> start();
  // Events for a piece of split output (reasoning text deltas, output text deltas, whole function calls).
  std::vector<nlohmann::json> delta(const OutputDelta& d);
  // Closes the open items and ends with response.completed / response.incomplete (the full object).
  std::vector<nlohmann::json> finish(const GenerationResult& r, const OutputDelta& all);

 private:
  nlohmann::json event(const std::string& type, nlohmann::json body);
  std::vector<nlohmann::json> close_open();

  std::string id_, model_;
  int64_t created_;
  nlohmann::json echo_;
  int64_t seq_ = 0;
  int next_index_ = 0;
  // The item being streamed: none, a reasoning item, or a message's output_text.
  enum class Open { kNone, kReasoning, kText } open_ = Open::kNone;
  int open_index_ = -1;
  std::string open_text_;
  std::string open_item_id_;
};

}  // namespace dflash::server
