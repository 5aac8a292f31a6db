// dflash template: prints the prompt a chat request renders to (what the server tokenizes).
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "cli/commands.h"
#include "tokenizer/chat_template.h"

namespace dflash::cli {
namespace {

struct TemplateOptions {
  std::string model;
  std::string template_file;
  std::string request;
  std::string bos_token;
  std::string eos_token;
};

Result<nlohmann::ordered_json> read_request(const std::string& path) {
  DF_ASSIGN_OR_RETURN(std::string text, read_text_file(path, size_t{256} << 20));
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("{}: not valid JSON", path);
  if (!j.is_object()) return invalid_argument("{}: the request must be a JSON object", path);
  if (!j.contains("messages")) return invalid_argument("{}: the request has no 'messages'", path);
  return j;
}

Result<std::string> render(const TemplateOptions& opt) {
  ChatTemplateSource source;
  if (!opt.model.empty()) {
    DF_ASSIGN_OR_RETURN(source, load_chat_template(opt.model));
  }
  if (!opt.template_file.empty()) {
    DF_ASSIGN_OR_RETURN(source.source, read_text_file(opt.template_file, size_t{16} << 20));
    source.tool_use_source.clear();
    source.origin = opt.template_file;
  }
  if (!opt.bos_token.empty()) source.bos_token = opt.bos_token;
  if (!opt.eos_token.empty()) source.eos_token = opt.eos_token;
  DF_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::create(source));
  DF_ASSIGN_OR_RETURN(nlohmann::ordered_json request, read_request(opt.request));
  const nlohmann::ordered_json null_json;
  auto field = [&](const char* key) -> const nlohmann::ordered_json& {
    auto it = request.find(key);
    return it == request.end() ? null_json : *it;
  };
  // The server always asks for the assistant's turn; a request may opt out like vLLM's extension.
  bool add_generation_prompt = true;
  if (const auto& agp = field("add_generation_prompt"); agp.is_boolean()) add_generation_prompt = agp.get<bool>();
  Result<std::string> text =
      tmpl.render(field("messages"), field("tools"), add_generation_prompt, field("chat_template_kwargs"));
  if (!text.ok()) return text.status().with_context(source.origin);
  return text;
}

}  // namespace

void add_template_command(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<TemplateOptions>();
  auto* cmd = app.add_subcommand("template", "Print the prompt an OpenAI chat request renders to");
  auto* model = cmd->add_option("--model,-m", opt->model, "GGUF file or HF model directory whose chat template to use");
  auto* file = cmd->add_option("--template,-t", opt->template_file, "A chat template file (.jinja) to use instead");
  cmd->add_option("--request,-r", opt->request, "JSON file with the chat request (messages, tools, chat_template_kwargs)")
      ->required();
  cmd->add_option("--bos-token", opt->bos_token, "bos_token for the template (default: the model's)");
  cmd->add_option("--eos-token", opt->eos_token, "eos_token for the template (default: the model's)");
  cmd->callback([opt, model, file, &exit_code] {
    if (model->count() == 0 && file->count() == 0) {
      exit_code = report(invalid_argument("give --model or --template"));
      return;
    }
    Result<std::string> text = render(*opt);
    if (!text.ok()) {
      exit_code = report(text.status());
      return;
    }
    std::fwrite(text->data(), 1, text->size(), stdout);
    std::fflush(stdout);
    exit_code = 0;
  });
}

}  // namespace dflash::cli
