// Hostile templates and inputs: every limit ends the render with a Status, nothing crashes or throws.
#include <random>

#include <gtest/gtest.h>

#include "jinja_test_helpers.h"

namespace dflash::jinja {
namespace {

using testing::ctx;
using testing::error_of;
using testing::render;

bool mentions(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

TEST(JinjaLimits, deeply_nested_expressions_are_rejected_at_parse_time) {
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_TRUE(mentions(error_of(deep), "nested too deeply") || mentions(error_of(deep), "too deeply"));
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  for (int i = 0; i < 1000; ++i) ifs += "{% endif %}";
  EXPECT_TRUE(mentions(error_of(ifs), "nested too deeply"));
  std::string nots = "{{ " + std::string(0, ' ');
  for (int i = 0; i < 3000; ++i) nots += "not ";
  nots += "1 }}";
  EXPECT_TRUE(mentions(error_of(nots), "nested too deeply"));
  std::string filters = "{{ 1";
  for (int i = 0; i < 100000; ++i) filters += "|string";
  filters += " }}";
  Limits small;
  small.render.max_steps = 1000;
  EXPECT_NE(error_of(filters, nlohmann::ordered_json::object(), small), "");
}

TEST(JinjaLimits, runaway_macro_recursion_stops) {
  EXPECT_TRUE(mentions(error_of("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"), "nested deeper"));
  Limits small;
  small.render.max_steps = 200000;
  EXPECT_TRUE(mentions(error_of("{% macro m(n) %}{% if n %}{{ m(n-1) }}{{ m(n-1) }}{% endif %}{% endmacro %}{{ m(60) }}",
                                nlohmann::ordered_json::object(), small),
                       "steps"));
}

TEST(JinjaLimits, output_size_is_bounded) {
  Limits small;
  small.render.max_output_bytes = 1000;
  EXPECT_TRUE(mentions(error_of("{% for i in range(1000) %}xxxxxxxxxx{% endfor %}", nlohmann::ordered_json::object(), small),
                       "output limit"));
  EXPECT_TRUE(mentions(error_of("{{ 'x' * 100000 }}", nlohmann::ordered_json::object(), small), "too large"));
  EXPECT_TRUE(mentions(error_of("{% set ns = namespace(s='xxxxxxxxxx') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                                nlohmann::ordered_json::object(), small),
                       "limit"));
  EXPECT_TRUE(mentions(error_of("{{ 'long' * 100000000 }}"), "too large"));
}

TEST(JinjaLimits, loop_iterations_are_bounded) {
  Limits small;
  small.render.max_loop_iterations = 10000;
  EXPECT_TRUE(mentions(error_of("{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}",
                                nlohmann::ordered_json::object(), small),
                       "iterations"));
}

TEST(JinjaLimits, the_sandbox_range_limit_applies) {
  EXPECT_TRUE(mentions(error_of("{{ range(1000000)|length }}"), "Range too big"));
  EXPECT_EQ(render("{{ range(100000)|length }}"), "100000");
  EXPECT_TRUE(mentions(error_of("{{ range(-9223372036854775807, 9223372036854775807)|length }}"), "Range too big"));
}

TEST(JinjaLimits, template_size_is_bounded) {
  Limits small;
  small.max_template_bytes = 100;
  EXPECT_TRUE(mentions(error_of(std::string(200, 'x'), nlohmann::ordered_json::object(), small), "limit"));
}

TEST(JinjaLimits, deeply_nested_context_values_are_rejected) {
  std::string deep = std::string(1000, '[') + std::string(1000, ']');
  Result<Template> t = Template::parse("{{ x }}");
  ASSERT_TRUE(t.ok());
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["x"] = nlohmann::ordered_json::parse(deep);
  Result<std::string> r = t->render(context);
  EXPECT_FALSE(r.ok());
}

TEST(JinjaLimits, bytes_that_are_not_utf8_pass_through_unchanged) {
  std::string tmpl = "a\xff\xfe{{ s }}\xc3";
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["s"] = std::string("\x80z");
  Result<Template> t = Template::parse(tmpl);
  ASSERT_TRUE(t.ok());
  Result<std::string> r = t->render(context);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, "a\xff\xfe\x80z\xc3");
  EXPECT_EQ(render("{{ s|length }} {{ s[0]|length }} {{ s|upper }}", context), "2 1 \x80Z");
}

TEST(JinjaLimits, random_garbage_never_crashes) {
  std::mt19937 rng(12345);
  const std::string alphabet = "{}%#-+~|.,:()[]'\"\\ \n\tabcxyz019_=<>!*/ifendforsetmacroinisnot";
  const char* snippets[] = {"{{", "}}", "{%", "%}", "{#", "#}", "if", "for", "endfor", "endif", "set", "macro",
                            "loop.", "x", "|", "(", ")", "[", "]", "'", "\"", "raw", "endraw", " in ", "range(9)"};
  for (int n = 0; n < 3000; ++n) {
    std::string t;
    int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) {
      if (rng() % 3 == 0) {
        t += snippets[rng() % (sizeof(snippets) / sizeof(snippets[0]))];
      } else {
        t += alphabet[rng() % alphabet.size()];
      }
    }
    Limits limits;
    limits.render.max_steps = 100000;
    Result<Template> parsed = Template::parse(t, limits);
    if (parsed.ok()) (void)parsed->render(nlohmann::ordered_json::object());
  }
  SUCCEED();
}

}  // namespace
}  // namespace dflash::jinja
