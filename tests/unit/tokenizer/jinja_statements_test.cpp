// Statements: if, for (loop variables, else, filters, unpacking, break/continue), scoping, set, namespaces,
// macros, call and filter blocks, with. Expected texts are jinja2 3.1's.
#include <gtest/gtest.h>

#include "jinja_test_helpers.h"

namespace dflash::jinja {
namespace {

using testing::ctx;
using testing::error_of;
using testing::render;

TEST(JinjaStatements, if_elif_else) {
  EXPECT_EQ(render("{% if 1 %}a{% elif 2 %}b{% else %}c{% endif %}{% if 0 %}a{% elif 2 %}b{% else %}c{% endif %}"
                   "{% if 0 %}a{% elif 0 %}b{% else %}c{% endif %}{% if 0 %}a{% endif %}"),
            "abc");
}

TEST(JinjaStatements, loop_variables) {
  EXPECT_EQ(render("{% for x in [3, 1, 2] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
                   "{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}"),
            "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}[{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}]{{ loop.cycle('a', 'b') }}{% endfor %}"),
            "[<1>2]a[1<2>3]b[2<3>]a");
  EXPECT_EQ(render("{% for x in [1] %}{{ loop.previtem is defined }}{{ loop.depth }}{% endfor %}"), "False1");
}

TEST(JinjaStatements, for_filter_else_and_unpacking) {
  EXPECT_EQ(render("{% for x in [1, 2, 3] if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %}"),
            "1/2:2 2/2:3 ");
  EXPECT_EQ(render("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}{% for x in [0] if x %}{% else %}none kept{% endfor %}"),
            "emptynone kept");
  EXPECT_EQ(render("{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %} {% for k, v in {'x': 1, 'y': 2}|items %}{{ k }}{{ v }}{% endfor %}"),
            "1234 x1y2");
  EXPECT_EQ(render("{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %} {% for c in 'hé' %}[{{ c }}]{% endfor %}"),
            "ba [h][é]");
  EXPECT_NE(error_of("{% for a, b in [[1]] %}{% endfor %}").find("not enough values to unpack"), std::string::npos);
  EXPECT_NE(error_of("{% for a, b in [[1, 2, 3]] %}{% endfor %}").find("too many values to unpack"), std::string::npos);
  EXPECT_NE(error_of("{% for x in 5 %}{% endfor %}").find("not iterable"), std::string::npos);
}

TEST(JinjaStatements, break_and_continue) {
  EXPECT_EQ(render("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "0134");
  EXPECT_EQ(render("{% for a in [1, 2] %}{% for b in [1, 2, 3] %}{% if b == 2 %}{% break %}{% endif %}{{ a }}{{ b }} {% endfor %}{% endfor %}"),
            "11 21 ");
}

TEST(JinjaStatements, loop_bodies_are_scopes_and_if_bodies_are_not) {
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}"), "21");
  EXPECT_EQ(render("{% set x = 0 %}{% for i in [1, 2] %}{% if true %}{% set x = i %}{% endif %}{{ x }}{% endfor %}{{ x }}"),
            "120");
  EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
  // Each iteration starts from the enclosing scope again.
  EXPECT_EQ(render("{% for i in [1, 2] %}[{{ x }}]{% set x = i %}{% endfor %}"), "[][]");
  EXPECT_EQ(render("{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }};{% endfor %}{{ loop.index }}|{% endfor %}"),
            "113;214;1|123;224;2|");
}

TEST(JinjaStatements, set_forms) {
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set t = (3, 4) %}{% set c, e = t %}{{ c }}{{ e }}"), "12 34");
  EXPECT_EQ(render("{% set t %}\n  hello {{ 'x' }}\n{% endset %}[{{ t }}]"), "[  hello x\n]");
  EXPECT_EQ(render("{% set x | upper %}abc{% endset %}{{ x }}"), "ABC");
  EXPECT_NE(error_of("{% set a, b = [1] %}").find("not enough values"), std::string::npos);
}

TEST(JinjaStatements, namespaces_carry_state_out_of_loops) {
  EXPECT_EQ(render("{% set ns = namespace(x=0, found=false) %}{% for i in range(5) %}{% set ns.x = ns.x + i %}"
                   "{% if i == 3 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.x }} {{ ns.found }}"),
            "10 True");
  EXPECT_EQ(render("{% set ns = namespace(items=[]) %}{% for i in range(3) %}{% set ns.items = ns.items + [i] %}{% endfor %}"
                   "{{ ns.items }} {{ ns['items'] }} {{ namespace(a=1) }}"),
            "[0, 1, 2] [0, 1, 2] <Namespace {'a': 1}>");
  EXPECT_EQ(render("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a + ns.b }}"), "3");
  EXPECT_NE(error_of("{% set x = 1 %}{% set x.y = 2 %}").find("non-namespace"), std::string::npos);
}

TEST(JinjaStatements, macros_with_defaults_keywords_and_recursion) {
  EXPECT_EQ(render("{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ m(1, c='z') }} {{ m() }}"),
            "1-2-x 1-3-x 1-2-z -2-x");
  EXPECT_EQ(render("{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}"), "54321");
  EXPECT_EQ(render("{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}"),
            "1(2, 3){'x': 4}");
  EXPECT_EQ(render("{% macro f(x) -%}\n  [{{ x }}]\n{%- endmacro %}\n{{ f(1) }}\n{{ f(2) }}"), "[1]\n[2]");
  // Macros see template-level variables as they are when called; their own sets stay inside.
  EXPECT_EQ(render("{% macro m() %}{{ x }}{% set y = 1 %}{% endmacro %}{% set x = 1 %}{{ m() }}{{ y }}"), "1");
  EXPECT_EQ(render("{%- macro outer() -%}{%- macro inner() -%}in{%- endmacro -%}<{{ inner() }}>{%- endmacro -%}{{ outer() }}"),
            "<in>");
  EXPECT_EQ(render("{% macro m(content) %}{{ content|trim }}{% endmacro %}{% set c = m('  x  ')|trim %}[{{ c }}]"), "[x]");
}

TEST(JinjaStatements, call_blocks_pass_caller) {
  EXPECT_EQ(render("{% macro m() %}[{{ caller() }}]{% endmacro %}{% call m() %}inside{% endcall %}"), "[inside]");
  EXPECT_EQ(render("{% macro list_it(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}"
                   "{% call(x) list_it([1, 2]) %}<{{ x }}>{% endcall %}"),
            "<1><2>");
}

TEST(JinjaStatements, filter_blocks_and_with) {
  EXPECT_EQ(render("{% filter upper %}hello {{ 'x' }}{% endfilter %}"), "HELLO X");
  EXPECT_EQ(render("{% filter trim %}   spaced   {% endfilter %}|{% filter indent(2) | upper %}a\nb{% endfilter %}"),
            "spaced|A\n  B");
  EXPECT_EQ(render("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]"), "3[]");
}

TEST(JinjaStatements, globals) {
  EXPECT_EQ(render("{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }}"),
            "[0, 1, 2] [1, 4, 7] [5, 3, 1] []");
  EXPECT_EQ(render("{{ dict(a=1, b=2) }} {{ dict({'x': 1}, y=2) }} {{ dict([('p', 1)]) }}"),
            "{'a': 1, 'b': 2} {'x': 1, 'y': 2} {'p': 1}");
  EXPECT_EQ(render("{% set j = joiner(', ') %}{% for x in [1, 2, 3] %}{{ j() }}{{ x }}{% endfor %}"), "1, 2, 3");
  EXPECT_EQ(render("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}"), "2025-01-15|15 Jan 2025");
}

TEST(JinjaStatements, raise_exception_fails_with_exactly_its_message) {
  EXPECT_EQ(error_of("before {{ raise_exception('Conversation roles must alternate!') }}"),
            "Conversation roles must alternate!");
  EXPECT_EQ(error_of("{% if true %}{{ raise_exception('a' ~ 1) }}{% endif %}"), "a1");
}

}  // namespace
}  // namespace dflash::jinja
