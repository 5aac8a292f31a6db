// Expressions: Python's arithmetic, comparison, truthiness and printing rules; attribute, item and slice
// access; undefined values; `is` tests; str/dict/list methods. Expected texts are jinja2 3.1's.
#include <gtest/gtest.h>

#include "jinja_test_helpers.h"

namespace dflash::jinja {
namespace {

using testing::ctx;
using testing::error_of;
using testing::render;

const char* kData = R"({"d": {"a": 1, "items": 2, "b": [1, 2]}, "l": [3, 1, 2], "s": "héllo wörld", "n": null,
                        "i": 7, "f": 2.5, "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})";

TEST(JinjaExpressions, arithmetic_follows_python) {
  EXPECT_EQ(render("{{ 1 + 2 }} {{ 7 // 2 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ -7 % 3 }} {{ 7 // -2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}"),
            "3 3 3.5 2.0 2 -4 1024 0.5");
  EXPECT_EQ(render("{{ 10 % -3 }} {{ 1.5 // 1 }} {{ -1.5 % 1 }} {{ 2 ** 0.5 }} {{ 10 - 3 * 2 }} {{ -2 ** 2 }} {{ 2 ** 3 ** 2 }}"),
            "-2 1.0 0.5 1.4142135623730951 4 4 64");  // Jinja's ** is left-associative and binds after unary minus
  EXPECT_EQ(render("{{ true + true }} {{ true * 3 }} {{ 'ab' * 3 }} {{ 3 * 'ab' }} {{ [1] * 3 }} {{ 'ab' * -1 }}|"),
            "2 3 ababab ababab [1, 1, 1] |");
  EXPECT_EQ(render("{{ [1, 2] + [3] }} {{ (1,) + (2,) }} {{ 'a' + 'b' }}"), "[1, 2, 3] (1, 2) ab");
}

TEST(JinjaExpressions, arithmetic_type_errors_and_division_by_zero_fail) {
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("can only concatenate str (not \"int\") to str"), std::string::npos);
  EXPECT_NE(error_of("{{ none + 1 }}").find("unsupported operand type(s) for +: 'NoneType' and 'int'"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 // 0 }}").find("by zero"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 % 0.0 }}").find("modulo"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
}

TEST(JinjaExpressions, tilde_concatenates_str_of_both_sides) {
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ true ~ 1.0 ~ [1] ~ undefined_name }}"), "a1NoneTrue1.0[1]");
}

TEST(JinjaExpressions, values_print_like_python_str) {
  EXPECT_EQ(render("{{ 1.0 }} {{ 1e20 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ -0.0 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }}"),
            "1.0 1e+20 1e-05 0.30000000000000004 -0.0 1e+16 1000000000000000.0 0.0001");
  EXPECT_EQ(render("{{ true }} {{ false }} {{ none }} {{ True }} {{ None }}"), "True False None True None");
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': 'v'}, (1,), (1, 2)] }}"),
            "[1, 'a', None, True, 1.5, {'k': 'v'}, (1,), (1, 2)]");
  EXPECT_EQ(render(R"({{ ["it's", 'say "x"', 'tab\there', 'nl\n', 'back\\slash', 'é', '\x01'] }})"),
            R"(["it's", 'say "x"', 'tab\there', 'nl\n', 'back\\slash', 'é', '\x01'])");
  EXPECT_EQ(render("{{ d }}", ctx(kData)), "{'a': 1, 'items': 2, 'b': [1, 2]}");
}

TEST(JinjaExpressions, comparisons_chain_and_compare_like_python) {
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ 'B' < 'a' }} {{ [1, 2] < [1, 3] }}"),
            "True False True True True");
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ 1 == true }} {{ [1] == [1.0] }} {{ (1, 2) == [1, 2] }} {{ none == none }} {{ 'é' < 'z' }}"),
            "True True True False True False");
  EXPECT_NE(error_of("{{ [1, 'a'] | sort }}").find("not supported between instances"), std::string::npos);
  EXPECT_NE(error_of("{{ none < 1 }}"), "");
}

TEST(JinjaExpressions, logic_returns_operands_and_short_circuits) {
  EXPECT_EQ(render("{{ true and 'x' }} {{ false or 'y' }} {{ 0 or [] }} {{ not 0 }} {{ not 'a' }}"), "x y [] True False");
  EXPECT_EQ(render("{{ false and undefined_name.attr }}|{{ true or undefined_name.attr }}"), "False|True");
}

TEST(JinjaExpressions, membership) {
  EXPECT_EQ(render("{{ 1 in l }} {{ 5 not in l }} {{ 'é' in s }} {{ 'a' in d }} {{ 'x' in d }} {{ 'a' in undefined_name }}",
                   ctx(kData)),
            "True True True True False False");
  EXPECT_NE(error_of("{{ 1 in 'abc' }}").find("requires string as left operand"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 in none }}").find("not iterable"), std::string::npos);
}

TEST(JinjaExpressions, conditional_expressions) {
  EXPECT_EQ(render("{{ 1 if true else 2 }} {{ 1 if false else 2 }} [{{ 1 if false }}] {{ 'a' if none else 'b' if 0 else 'c' }}"),
            "1 2 [] c");
}

TEST(JinjaExpressions, attribute_and_item_access) {
  EXPECT_EQ(render("{{ msgs[0].role }} {{ msgs[-1]['content'] }} {{ l[0] }} {{ l.0 }} {{ d['items'] }} {{ d.b[1] }}",
                   ctx(kData)),
            "user yo 3 3 2 2");
  // A missing key or index is undefined (prints empty), as is any attribute of None.
  EXPECT_EQ(render("[{{ d.missing }}|{{ l[10] }}|{{ d.missing is defined }}|{{ n.x }}|{{ 'x'.nope }}]", ctx(kData)),
            "[||False||]");
  // `.name` finds the dict method first, `['name']` the key first.
  EXPECT_EQ(render("{{ d.items()|list }}", ctx(kData)), "[('a', 1), ('items', 2), ('b', [1, 2])]");
}

TEST(JinjaExpressions, slices_count_code_points_and_accept_steps) {
  EXPECT_EQ(render("{{ s[1:4] }} {{ s[::-1] }} {{ s[-1] }} {{ s|length }} {{ 'abcdef'[1:5:2] }}", ctx(kData)),
            "éll dlröw olléh d 11 bd");
  EXPECT_EQ(render("{{ [1,2,3][1:] }} {{ [1,2,3][::-1] }} {{ l[:-1] }} {{ l[5:] }} {{ (1, 2, 3)[1:] }}", ctx(kData)),
            "[2, 3] [3, 2, 1] [3, 1] [] (2, 3)");
  EXPECT_NE(error_of("{{ n[1:] }}", ctx(kData)).find("not subscriptable"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc'[::0] }}").find("step cannot be zero"), std::string::npos);
}

TEST(JinjaExpressions, undefined_values_behave_like_jinjas_default_undefined) {
  EXPECT_EQ(render("[{{ foo }}] {{ foo is defined }} {{ foo is undefined }} {{ not foo }} {{ foo|length }} {{ foo ~ 'x' }}"),
            "[] False True True 0 x");
  EXPECT_EQ(render("{% for x in foo %}{{ x }}{% else %}empty{% endfor %} {{ foo == foo }} {{ foo is iterable }}"),
            "empty True True");
  EXPECT_NE(error_of("{{ foo.bar }}").find("'foo' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ foo['bar'] }}").find("'foo' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ foo + 1 }}").find("'foo' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ foo() }}").find("'foo' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ d.missing.x }}", ctx(kData)).find("'dict object' has no attribute 'missing'"),
            std::string::npos);
}

TEST(JinjaExpressions, tests_use_pythons_type_notions) {
  EXPECT_EQ(render("{{ x is defined }} {{ d is mapping }} {{ l is iterable }} {{ s is string }} {{ n is none }} "
                   "{{ i is integer }} {{ f is float }} {{ i is number }} {{ true is number }} {{ true is integer }} "
                   "{{ true is boolean }} {{ 1 is boolean }}",
                   ctx(kData)),
            "False True True True True True True True True False True False");
  EXPECT_EQ(render("{{ d is sequence }} {{ s is sequence }} {{ i is sequence }} {{ s is iterable }} {{ n is iterable }}",
                   ctx(kData)),
            "True True False True False");
  EXPECT_EQ(render("{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }} {{ 3.0 is odd }}"),
            "True True True False True");
  EXPECT_EQ(render("{{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 2 is gt 1 }} {{ 2 is lessthan 1 }} {{ 'a' is in 'abc' }} "
                   "{{ none is sameas none }} {{ 'ABC' is upper }} {{ 'abc' is lower }} {{ false is false }} {{ 0 is false }}"),
            "True False True False True True True True True False");
  EXPECT_EQ(render("{{ n is not none }} {{ s is not string }} {{ not s is string }}", ctx(kData)), "False False False");
  EXPECT_EQ(render("{{ 'upper' is filter }} {{ 'odd' is test }} {{ 'nope' is filter }}"), "True True False");
}

TEST(JinjaExpressions, string_methods) {
  EXPECT_EQ(render(R"({{ "  x  ".strip() }}|{{ "xxaxx".strip("x") }}|{{ " a ".lstrip() }}|{{ " a ".rstrip() }}|{{ "\n\nq\n".lstrip("\n") }})"),
            "x|a|a | a|q\n");
  EXPECT_EQ(render(R"({{ "a,b,,c".split(",") }} {{ " a  b ".split() }} {{ "a b c".split(None, 1) }} {{ "a-b-c".rsplit("-", 1) }} {{ "".split() }} {{ "".split(",") }})"),
            "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a-b', 'c'] [] ['']");
  EXPECT_EQ(render(R"({{ "x</think>y".split("</think>")[-1] }} {{ "a\nb\r\nc".splitlines() }})"), "y ['a', 'b', 'c']");
  EXPECT_EQ(render(R"({{ "hello".startswith("he") }} {{ "hello".endswith(("lo", "x")) }} {{ "hello".startswith("he", 1) }} {{ "hello".endswith("ll", 0, 4) }})"),
            "True True False True");
  EXPECT_EQ(render(R"({{ "hello".find("l") }} {{ "hello".rfind("l") }} {{ "héllo".find("l") }} {{ "hello".find("z") }} {{ "hello".count("l") }} {{ "hello".index("e") }})"),
            "2 3 2 -1 2 1");
  EXPECT_EQ(render(R"({{ "hello".replace("l", "L") }} {{ "aaa".replace("a", "b", 2) }} {{ "abc".replace("", "-") }})"),
            "heLLo bba -a-b-c-");
  EXPECT_EQ(render(R"({{ "Hello World".upper() }} {{ "Hello".lower() }} {{ "hello world".title() }} {{ "they're".title() }} {{ "hELLO".capitalize() }} {{ "aB".swapcase() }})"),
            "HELLO WORLD hello Hello World They'Re Hello Ab");
  EXPECT_EQ(render(R"({{ ", ".join(["a", "b"]) }} {{ "-".join("abc") }} {{ "123".isdigit() }} {{ "a1".isalnum() }} {{ " ".isspace() }} {{ "".isdigit() }})"),
            "a, b a-b-c True True True False");
  EXPECT_EQ(render(R"({{ "42".zfill(5) }} {{ "ab".center(7, "*") }} {{ "a,b".partition(",") }} {{ "pre_x".removeprefix("pre_") }})"),
            "00042 ***ab** ('a', ',', 'b') x");
  EXPECT_EQ(render(R"({{ "{} {}".format(1, "a") }} {{ "{0}{1}{0}".format("a", "b") }} {{ "{name}!".format(name="n") }} {{ "{:.2f}|{:05d}|{:>4}|{!r}".format(3.14159, 42, "x", "q") }})"),
            "1 a aba n! 3.14|00042|   x|'q'");
  EXPECT_NE(error_of(R"({{ "abc".index("z") }})").find("substring not found"), std::string::npos);
}

TEST(JinjaExpressions, dict_and_list_methods) {
  EXPECT_EQ(render("{{ d.get('a') }} {{ d.get('zz', 'dd') }} {{ d.get('zz') }} {{ d.keys()|list }} {{ d.values()|list }}",
                   ctx(kData)),
            "1 dd None ['a', 'items', 'b'] [1, 2, [1, 2]]");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ l.index(1) }} {{ l.count(3) }}", ctx(kData)),
            "a=1;items=2;b=[1, 2]; 1 1");
}

TEST(JinjaExpressions, the_sandbox_refuses_mutating_methods) {
  EXPECT_NE(error_of("{{ l.append(4) }}", ctx(kData)).find("access to attribute 'append' of 'list' object is unsafe"),
            std::string::npos);
  EXPECT_NE(error_of("{{ d.update({'x': 1}) }}", ctx(kData)).find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{{ d.pop('a') }}", ctx(kData)).find("unsafe"), std::string::npos);
}

TEST(JinjaExpressions, calling_a_non_callable_fails) {
  EXPECT_NE(error_of("{{ 'x'() }}").find("not callable"), std::string::npos);
}

}  // namespace
}  // namespace dflash::jinja
