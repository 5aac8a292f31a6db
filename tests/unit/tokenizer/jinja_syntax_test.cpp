// Lexing and parsing: whitespace control as transformers configures Jinja, comments, raw blocks,
// literals, and syntax errors with positions. Expected texts are what jinja2 3.1 renders.
#include <gtest/gtest.h>

#include "jinja_test_helpers.h"

namespace dflash::jinja {
namespace {

using testing::error_of;
using testing::render;

TEST(JinjaSyntax, trim_blocks_removes_the_newline_after_a_block_tag) {
  EXPECT_EQ(render("{% if true %}\nyes\n{% endif %}\nafter"), "yes\nafter");
  EXPECT_EQ(render("{{ 'v' }}\nnext"), "v\nnext");  // not after print tags
}

TEST(JinjaSyntax, lstrip_blocks_removes_indentation_before_block_tags_only) {
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(render("\t{% if true %}tab{% endif %}"), "tab");
  EXPECT_EQ(render("  {{ 'v' }}"), "  v");                               // print tags keep it
  EXPECT_EQ(render("x  {% if true %}y{% endif %}"), "x  y");             // not at line start
  EXPECT_EQ(render("  {{ 'v' }}  {% if true %}  t  {% endif %}  "), "  v    t    ");
}

TEST(JinjaSyntax, minus_strips_all_whitespace_and_plus_disables_the_defaults) {
  EXPECT_EQ(render("x   {{- 'y' -}}   z"), "xyz");
  EXPECT_EQ(render("{%- if true -%}\n   yes\n{%- endif %}\nafter"), "yesafter");
  EXPECT_EQ(render("{%+ if true %}  keep{% endif %}\n  {%+ if true %}x{% endif %}"), "  keep  x");  // the endif still eats its newline
  EXPECT_EQ(render("{% if true +%}\nkept{% endif %}"), "\nkept");
  EXPECT_EQ(render("{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}"), "  1\n  2\n");
  EXPECT_EQ(render("{%- for i in [1,2] -%}\n  {{ i }}\n{%- endfor -%}"), "12");
}

TEST(JinjaSyntax, comments_take_part_in_whitespace_control) {
  EXPECT_EQ(render("{# comment #}\na {# c2 -#}   b\n  {#- c3 #}c"), "a bc");
  EXPECT_EQ(render("line1\n    {#- comment -#}\nline2\n  {# c #}\nline3"), "line1line2\nline3");
  EXPECT_NE(error_of("{# never closed"), "");
}

TEST(JinjaSyntax, raw_blocks_are_literal) {
  EXPECT_EQ(render("{% raw %}{{ not parsed }}{% endraw %}"), "{{ not parsed }}");
  EXPECT_EQ(render("x {%- raw %} {{ y }} {% endraw -%} z"), "x {{ y }} z");
  EXPECT_EQ(render("{% raw %}\n  {{ x }}\n{% endraw %}\nafter"), "\n  {{ x }}\nafter");
  EXPECT_NE(error_of("{% raw %} no end"), "");
}

TEST(JinjaSyntax, one_trailing_newline_is_dropped_and_newlines_are_normalized) {
  EXPECT_EQ(render("text\n"), "text");
  EXPECT_EQ(render("text\n\n"), "text\n");
  EXPECT_EQ(render("a\r\nb\rc"), "a\nb\nc");
}

TEST(JinjaSyntax, string_literals_decode_python_escapes) {
  EXPECT_EQ(render(R"({{ 'a\nb\t\\\'' }})"), "a\nb\t\\'");
  EXPECT_EQ(render(R"({{ "\x41\u00e9\U0001F600" }})"), "A\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(render(R"({{ '\q' }})"), "\\q");  // unknown escapes stay
  EXPECT_EQ(render(R"({{ 'a' 'b' "c" }})"), "abc");  // adjacent literals concatenate
  EXPECT_EQ(render("{{ '}}' }}{{ \"{%\" }}"), "}}{%");
  EXPECT_NE(error_of(R"({{ '\x4' }})"), "");
}

TEST(JinjaSyntax, number_literals) {
  EXPECT_EQ(render("{{ 0x1f }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }} {{ 1.5e3 }} {{ 1E2 }} {{ 2.50 }}"),
            "31 15 5 1000 1500.0 100.0 2.5");
  EXPECT_NE(error_of("{{ 99999999999999999999 }}"), "");
}

TEST(JinjaSyntax, collection_literals_with_trailing_commas) {
  EXPECT_EQ(render("{{ [1,] }} {{ {'a': 1,} }} {{ (1,) }} {{ () }} {{ (1) }} {{ [] }} {{ {} }}"),
            "[1] {'a': 1} (1,) () 1 [] {}");
  EXPECT_EQ(render("{{ 1, 'a' }}"), "(1, 'a')");
}

TEST(JinjaSyntax, errors_carry_line_and_column) {
  std::string e = error_of("line one\n{{ x | }}");
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  e = error_of("{% if x %}\nunclosed");
  EXPECT_NE(e.find("syntax error"), std::string::npos) << e;
  e = error_of("ok\n  {{ 'a' ~ }}");
  EXPECT_NE(e.find("line 2, column"), std::string::npos) << e;
}

TEST(JinjaSyntax, malformed_templates_are_syntax_errors) {
  for (const char* t : {"{{ x", "{{ x | }}", "{% for %}", "{% endfor %}", "{{ 'a' ~ }}", "{% set 1 = 2 %}",
                        "{% macro m(a=1, b) %}{% endmacro %}", "{{ (1, 2 }}", "{{ [1, 2) }}", "{{ } }}",
                        "{% if true %}{% else %}{% else %}{% endif %}", "{% for x in y %}", "{{ x is }}",
                        "{{ a.  }}", "{{ 'unterminated }}", "{% %}", "{{ }}", "{{ 1 is not }}", "{% set x %}",
                        "{% call m %}{% endcall %}", "{{ @ }}"}) {
    std::string e = error_of(t);
    EXPECT_NE(e.find("syntax error"), std::string::npos) << t << " -> " << e;
  }
}

TEST(JinjaSyntax, unsupported_and_unknown_tags_are_rejected) {
  EXPECT_NE(error_of("{% include 'x' %}").find("not supported"), std::string::npos);
  EXPECT_NE(error_of("{% extends 'x' %}").find("not supported"), std::string::npos);
  EXPECT_NE(error_of("{% do x %}").find("unknown tag 'do'"), std::string::npos);  // transformers has no `do`
  EXPECT_NE(error_of("{% for x in [1] %}{% endfor %}{% break %}").find("outside loop"), std::string::npos);
  EXPECT_NE(error_of("{% for x in [1] recursive %}{% endfor %}").find("recursive"), std::string::npos);
}

TEST(JinjaSyntax, unknown_filters_fail_at_parse_time_except_in_conditional_branches) {
  EXPECT_NE(error_of("{{ x | nofilter }}").find("No filter named 'nofilter'"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 is nosuchtest }}").find("No test named 'nosuchtest'"), std::string::npos);
  EXPECT_NE(error_of("{% for i in [] %}{{ x|nofilter }}{% endfor %}").find("No filter"), std::string::npos);
  // Jinja defers the check inside if-branches and inline conditions: it fails only when reached.
  EXPECT_EQ(render("{% if false %}{{ x | nofilter }}{% endif %}"), "");
  EXPECT_EQ(render("{{ x|nofilter if false else 1 }}|{{ false and x|nofilter }}"), "1|False");
  EXPECT_NE(error_of("{% if true %}{{ 1 | nofilter }}{% endif %}").find("No filter"), std::string::npos);
}

TEST(JinjaSyntax, generation_blocks_render_their_body) {
  EXPECT_EQ(render("{% generation %}gen {{ 1 }}{% endgeneration %}"), "gen 1");
}

}  // namespace
}  // namespace dflash::jinja
