// `dflash tokenize`: prints the token ids of a text as a JSON array.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "base/file_io.h"
#include "cli/commands.h"
#include "tokenizer/load_tokenizer.h"

namespace dflash::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  std::string file;
  bool special = false;
};

int run_tokenize(const TokenizeOptions& o, bool have_text) {
  std::string text = o.text;
  if (!o.file.empty()) {
    auto r = read_text_file(o.file);
    if (!r.ok()) return report(r.status());
    text = std::move(r).value();
  } else if (!have_text) {
    return report(invalid_argument("tokenize: give the text with --text or --file"));
  }
  auto tok = load_tokenizer(o.model);
  if (!tok.ok()) return report(tok.status());
  auto ids = tok->encode(text, o.special);
  if (!ids.ok()) return report(ids.status());
  std::string out = "[";
  for (size_t i = 0; i < ids->size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string((*ids)[i]);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : report(io_error("tokenize: cannot write to stdout"));
}

}  // namespace

void add_tokenize_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  cmd->add_option("--model,-m", opts->model, "GGUF file, HF model directory, or tokenizer.json")->required();
  auto* text = cmd->add_option("--text,-t", opts->text, "Text to tokenize");
  auto* file = cmd->add_option("--file,-f", opts->file, "Read the text from this file (bytes as they are)");
  text->excludes(file);
  cmd->add_flag("--special", opts->special,
                "Parse special tokens (<|im_start|>) in the text; without it they are tokenized as plain text");
  cmd->callback([opts, text, &exit_code] { exit_code = run_tokenize(*opts, text->count() > 0); });
}

}  // namespace dflash::cli
