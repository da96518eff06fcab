"""Grammar-constrained decoding: the GBNF parser (every construct, error positions), the C matcher
against a brute-force oracle over a real vocabulary, JSON Schema conversion, and generation with the
real models (every output inside its grammar, parsed by json.loads, validated by jsonschema)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgellama.grammar import (
    GrammarError,
    bundled_names,
    grammar_file,
    grammar_from_schema,
    parse,
)
from edgellama.grammar.json_schema import schema_to_gbnf
from edgellama.grammar.matcher import DONE, CompiledGrammar, GrammarMatcher, VocabTrie


def accepts(grammar: str, text: str) -> bool:
    """text is a complete sentence of grammar (the C matcher, byte by byte)."""
    g = CompiledGrammar(parse(grammar))
    s = g.step(g.start, text.encode())
    return s >= 0 and bool(g.flags(s) & 1)


def prefix_ok(grammar: str, text: bytes) -> bool:
    g = CompiledGrammar(parse(grammar))
    return g.step(g.start, text) >= 0


# ---- parser: every construct, with what it accepts and refuses ----

CONSTRUCTS = [
    ('root ::= "abc"', ["abc"], ["ab", "abcd", ""]),
    ('root ::= "a" | "b" | ""', ["a", "b", ""], ["ab", "c"]),
    ('root ::= ("a" | "b") "c"', ["ac", "bc"], ["c", "abc"]),
    ('root ::= "a"*', ["", "a", "aaaa"], ["b"]),
    ('root ::= "ab"+', ["ab", "abab"], ["", "a", "aba"]),
    ('root ::= "a"? "b"', ["b", "ab"], ["aab"]),
    ('root ::= "a"{3}', ["aaa"], ["aa", "aaaa"]),
    ('root ::= "a"{2,}', ["aa", "aaaaa"], ["a"]),
    ('root ::= "a"{1,3}', ["a", "aa", "aaa"], ["", "aaaa"]),
    ('root ::= "a"{0,2}', ["", "a", "aa"], ["aaa"]),
    ('root ::= [a-c0-9_]+', ["a", "b9_c"], ["d", "A"]),
    ('root ::= [^a-c\\n]', ["d", "é", "中"], ["a", "c", "\n"]),
    ('root ::= .', ["x", "中", "\n"], ["", "xy"]),
    ('root ::= "\\n\\t\\\\\\"" "\\x41" "\\u00e9" "\\U0001F600"', ['\n\t\\"Aé😀'], ["\n"]),
    ('root ::= [\\x30-\\x32\\]-]', ["0", "2", "]", "-"], ["3"]),
    ('root ::= [-a]', ["-", "a"], ["b"]),
    ('root ::= item ("," item)*\nitem ::= [0-9]+', ["1", "1,22,3"], ["1,", ",1"]),
    ('# a comment\nroot ::= # here too\n  "a" | # and here\n  "b"\n', ["a", "b"], ["#"]),
    ('root ::= (\n  "a"\n  | "b"\n)\n', ["a", "b"], [""]),
    ('root ::= "x" sub\nsub ::= "y" sub | "z"', ["xz", "xyyz"], ["xy"]),
    ('root ::= "é"', ["é"], ["e"]),
    ('root ::= "a" empty "b"\nempty ::= ""', ["ab"], ["a"]),
    ('root\t::=\t"a"\r\n', ["a"], []),
]


@pytest.mark.parametrize(("grammar", "good", "bad"), CONSTRUCTS)
def test_constructs(grammar: str, good: list[str], bad: list[str]) -> None:
    for text in good:
        assert accepts(grammar, text), (grammar, text)
    for text in bad:
        assert not accepts(grammar, text), (grammar, text)


# grammars written like those in llama.cpp's grammars/ folder (our own wording, same constructs)
STYLE_GRAMMARS = {
    "chess": 'root ::= "1. " move " " move "\\n" ([1-9] [0-9]? ". " move " " move "\\n")+\n'
             'move ::= (pawn | nonpawn | castle) [+#]?\npawn ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBRQ])?\n'
             'nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]\ncastle ::= "O-O" "-O"?',
    "c": 'root ::= (declaration)*\ndeclaration ::= dataType identifier "(" parameter? ")" "{" statement* "}"\n'
         'dataType ::= "int" ws | "float" ws | "char" ws\nidentifier ::= [a-zA-Z_] [a-zA-Z_0-9]*\n'
         'parameter ::= dataType identifier\nstatement ::= ( dataType identifier ws "=" ws expression ";" ) | '
         '( "return" ws expression ";" )\nexpression ::= term (("+" | "-") term)*\n'
         'term ::= factor(("*" | "/") factor)*\nfactor ::= identifier | number | "(" expression ")"\n'
         'number ::= [0-9]+\nws ::= [ \\t\\n]*',
    "japanese": 'root ::= jp-char+ ([ \\t\\n] jp-char+)*\njp-char ::= hiragana | katakana | punctuation | cjk\n'
                'hiragana ::= [ぁ-ゟ]\nkatakana ::= [ァ-ヿ]\npunctuation ::= [、-〾]\ncjk ::= [一-鿿]',
    "english": 'root ::= sentence+\nsentence ::= word (" " word)* [.!?] "\\n"?\nword ::= [A-Za-z\']+',
}


def test_bundled_and_llamacpp_style_grammars_parse() -> None:
    assert {"json", "json_arr", "list", "yes_no", "number", "arithmetic"} <= set(bundled_names())
    for name in bundled_names():
        CompiledGrammar(parse(grammar_file(name)))
    for text in STYLE_GRAMMARS.values():
        CompiledGrammar(parse(text))
    assert accepts(STYLE_GRAMMARS["chess"], "1. e4 e5\n2. Nf3 Nc6\n")
    assert accepts(STYLE_GRAMMARS["c"], "int main(){int x=1+2;return x;}")
    assert accepts(STYLE_GRAMMARS["japanese"], "こんにちは 世界")
    assert accepts(grammar_file("json"), '{"a": [1, -2.5e3, "x\\u00e9", true, null, {}]}')
    assert not accepts(grammar_file("json"), '{"a": 01}')
    assert accepts(grammar_file("json_arr"), '[1, {"b": []}]')
    assert accepts(grammar_file("list"), "- one\n- two\n")
    assert accepts(grammar_file("arithmetic"), "(a + 2) * 3 = 9\n")
    assert accepts(grammar_file("number"), "-12.5") and not accepts(grammar_file("number"), "1.")


BROKEN = [
    ('root ::= "abc', 1, 14, "unterminated string"),
    ('root ::= [abc', 1, 10, "unterminated character class"),
    ('root ::= foo', 1, 10, "undefined rule 'foo'"),
    ('root ::= "a"\nroot ::= "b"', 2, 1, "defined twice"),
    ('root "a"', 1, 6, "expected '::='"),
    ('root ::= ("a"', 1, 14, "missing ')'"),
    ('root ::= "a" )', 1, 14, "unexpected ')'"),
    ('root ::= "\\q"', 1, 11, "unknown escape"),
    ('root ::= "\\x4"', 1, 11, "2 hex digits"),
    ('root ::= [\\-]', 1, 11, "unknown escape"),  # llama.cpp's escapes only
    ('root ::= * "a"', 1, 10, "nothing before it to repeat"),
    ('root ::= "a"{3,2}', 1, 13, "below the minimum"),
    ('root ::= "a"{2', 1, 15, "expected '}'"),
    ('root ::= [z-a]', 1, 10, "reversed"),
    ('\n\nroot ::= "a"\n::= "b"', 4, 1, "expected a rule name"),
    ('root ::= "a"\nx ::= y\n', 2, 7, "undefined rule 'y'"),
]


@pytest.mark.parametrize(("text", "line", "col", "words"), BROKEN)
def test_error_positions(text: str, line: int, col: int, words: str) -> None:
    with pytest.raises(GrammarError) as e:
        parse(text)
    assert f"line {line}, column {col}" in str(e.value) and words in str(e.value), str(e.value)


@pytest.mark.parametrize("text", ['x ::= "a"', 'root ::= root "a"', 'root ::= a "x"\na ::= b? root\nb ::= "b"',
                                  'root ::= e\ne ::= e "+" t | t\nt ::= [0-9]'])
def test_no_root_and_left_recursion_refused(text: str) -> None:
    with pytest.raises(GrammarError) as e:
        parse(text)
    assert "root" in str(e.value) or "left recursion" in str(e.value)


def test_utf8_split_across_tokens() -> None:
    g = CompiledGrammar(parse('root ::= "中" [é]'))
    s = g.step(g.start, "中".encode()[:1])  # half a character: still possibly inside
    assert s >= 0 and not g.flags(s)
    s = g.step(s, "中".encode()[1:] + "é".encode()[:1])
    assert s >= 0 and g.step(s, "é".encode()[1:]) >= 0
    assert g.step(g.start, "丁".encode()) == -1 and g.step(g.start, "é".encode()[:1]) == -1
    assert g.step(g.start, b"\xe0\x80") == -1  # only overlong encodings start so
    assert g.step(g.start, b"\xe4\xb8\xae") == -1 and g.step(g.start, b"\xff") == -1


# ---- the matcher against a brute-force oracle on a real vocabulary ----

def _random_grammar(rng: random.Random, depth: int = 0) -> tuple[str, str]:
    """(GBNF expression, the same as a Python regex) over a small ASCII alphabet."""
    kind = rng.choice(["lit", "class", "seq", "alt", "rep"] if depth < 3 else ["lit", "class"])
    if kind == "lit":
        word = "".join(rng.choice("ab {}\"1 ") for _ in range(rng.randint(1, 3)))
        return json.dumps(word), "".join("\\" + c if not c.isalnum() else c for c in word)
    if kind == "class":
        chars = sorted({rng.choice("abcxyz019 ") for _ in range(rng.randint(1, 4))})
        body = "".join(chars)
        return f"[{body}]", "[" + "".join("\\" + c if not c.isalnum() else c for c in body) + "]"
    if kind == "seq":
        parts = [_random_grammar(rng, depth + 1) for _ in range(rng.randint(2, 3))]
        return "(" + " ".join(p[0] for p in parts) + ")", "(?:" + "".join(p[1] for p in parts) + ")"
    if kind == "alt":
        parts = [_random_grammar(rng, depth + 1) for _ in range(rng.randint(2, 3))]
        return "(" + " | ".join(p[0] for p in parts) + ")", "(?:" + "|".join(p[1] for p in parts) + ")"
    g, r = _random_grammar(rng, depth + 1)
    op = rng.choice(["*", "+", "?", "{1,3}", "{2}"])
    return f"({g}){op}", f"(?:{r}){op}"


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path: Path) -> Iterator[Any]:
    from edgellama.gguf.metadata import Metadata
    from edgellama.gguf.reader import GGUFFile
    from edgellama.tokenizers.tokenizer import tokenizer_from_metadata

    f = GGUFFile(smollm2_path)
    try:
        yield tokenizer_from_metadata(Metadata.of(f))
    finally:
        f.close()


def test_mask_equals_brute_force_oracle(smollm2_tokenizer: Any) -> None:
    import regex

    tok = smollm2_tokenizer
    pieces = [tok.token_bytes(i) for i in range(tok.n_vocab)]
    trie = VocabTrie(pieces)
    rng = random.Random(20)
    for case in range(5):
        expr, rx = _random_grammar(rng)
        pattern = regex.compile(rx)
        m = GrammarMatcher(parse(f"root ::= {expr}"), trie, set(tok.eot_ids))
        out = b""
        for _step in range(3):
            mask = m.mask()
            for i, piece in enumerate(pieces):
                if i in tok.eot_ids:
                    want = pattern.fullmatch(out.decode()) is not None
                else:
                    try:
                        text = (out + piece).decode("utf-8")
                    except UnicodeDecodeError:
                        text = None
                    want = bool(piece) and text is not None and \
                        pattern.fullmatch(text, partial=True) is not None
                assert mask[i] == want, (expr, out, piece, want)
            allowed = [i for i in range(len(pieces)) if mask[i] and i not in tok.eot_ids]
            if not allowed or m.done:
                break
            t = rng.choice(allowed)
            assert m.allows(t)
            m.accept(t)
            out += pieces[t]


# ---- JSON Schema ----

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12},
                                      "age": {"type": "integer"}, "ok": {"type": "boolean"}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "n": {"const": 3},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                               "minItems": 1, "maxItems": 3}},
     "required": ["color", "n", "tags"]},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date"},
                                      "id": {"type": "string", "format": "uuid"},
                                      "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{2,3}$"},
                                      "score": {"anyOf": [{"type": "number"}, {"type": "null"}]}},
     "required": ["when", "code", "score"]},
    {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                      "required": ["x", "y"]}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
     "required": ["a"]},
    {"type": "array", "items": {"type": ["integer", "string"]}, "maxItems": 4},
    {"type": "object", "properties": {"p": {"type": "string", "maxLength": 6}, "q": {"type": "integer"}}},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_schema_grammar_accepts_only_valid_instances(schema: dict[str, Any]) -> None:
    import jsonschema

    text = schema_to_gbnf(schema)
    samples = [{"name": "Bo", "age": 3}, {"name": "", "age": 3}, {"name": "Bo", "age": 3, "x": 1},
               {"color": "red", "n": 3, "tags": ["a"]}, {"color": "pink", "n": 3, "tags": ["a"]},
               {"color": "red", "n": 3, "tags": []}, {"when": "2024-02-29", "code": "AB-12", "score": None},
               {"when": "2024-13-01", "code": "AB-12", "score": 1.5}, {"when": "2024-01-01", "code": "ab-12",
                                                                       "score": 1},
               {"a": {"x": 1, "y": 2}}, {"a": {"x": 1}}, [1, "a", 2], [1, 2, 3, 4, 5], [], {}, {"q": 1},
               {"p": "abcdefg"}, {"q": 1, "p": "x"}]
    checker = jsonschema.FormatChecker()
    for inst in samples:
        valid = jsonschema.Draft202012Validator(schema, format_checker=checker).is_valid(inst)
        compact = json.dumps(inst, separators=(",", ":"))
        if accepts(text, compact):  # what the grammar takes must validate
            assert valid, (schema, compact)
    # and a valid compact and indented instance of each is accepted
    good = {0: {"name": "Bo", "age": 3}, 1: {"color": "red", "n": 3, "tags": ["a"]},
            2: {"when": "2024-02-29", "code": "AB-12", "score": None}, 3: {"a": {"x": 1, "y": 2}},
            4: [1, "a"], 5: {"p": "x", "q": 2}}[SCHEMAS.index(schema)]
    assert accepts(text, json.dumps(good, separators=(",", ":")))
    assert accepts(text, json.dumps(good, indent=2))


# what is refused, and the bounds, tuples, allOf and $ref pointers: tests/test_json_schema.py


def test_recursive_schema() -> None:
    schema = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                                  "kids": {"type": "array",
                                                                           "items": {"$ref": "#/$defs/node"}}},
                                 "required": ["v"]}}, "$ref": "#/$defs/node"}
    assert accepts(schema_to_gbnf(schema), '{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]}')


# ---- generation with the real models ----

@pytest.fixture(scope="module", params=["gemma", "smollm2"])
def llm(request: pytest.FixtureRequest) -> Iterator[Any]:
    from edgellama.llm import LLM

    # Gemma 3 270m is a base model without a chat template: its own turn format, hand-written
    chat = "gemma" if request.param == "gemma" else None
    with LLM(request.getfixturevalue(f"{request.param}_path"), n_ctx=512, n_threads=2, chat_format=chat) as m:
        yield m


def generate(llm: Any, prompt: str, grammar: Any, seed: int, n: int = 120) -> tuple[str, str]:
    from edgellama.grammar import constrain
    from edgellama.sampling import Sampler, SamplerParams

    fmt = llm.chat
    ids = llm.tokenizer.encode(fmt.render([{"role": "user", "content": prompt}]),
                               add_special=not fmt.added_special, parse_special=True)
    sampler = constrain(Sampler(SamplerParams(temp=0.8, seed=seed), llm.n_ctx), grammar, llm.tokenizer)
    text, reason = "", ""
    for ev in llm.generate(ids, sampler, n):
        text += ev.text
        reason = ev.stop_reason or reason
    return text, reason


def test_json_grammar_outputs_parse(llm: Any) -> None:
    g = parse(grammar_file("json"))
    for seed in range(2):
        text, reason = generate(llm, "Give a tiny JSON object describing a cat (2 keys).", g, seed, 96)
        if reason == "length":  # cut short: still a prefix the grammar accepts
            assert prefix_ok(grammar_file("json"), text.encode())
            continue
        assert isinstance(json.loads(text), dict), text


def test_schema_outputs_validate(llm: Any) -> None:
    import jsonschema

    for seed, schema in enumerate(SCHEMAS[:3]):
        text, reason = generate(llm, "Fill in this JSON record.", grammar_from_schema(schema), seed, 200)
        assert reason == "eos", text
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


def test_word_grammars_only_produce_their_words(llm: Any) -> None:
    yes_no = parse(grammar_file("yes_no"))
    colors = grammar_from_schema({"enum": ["red", "green", "blue"]})
    for seed in range(2):
        text, reason = generate(llm, "Is the sea salty?", yes_no, seed, 8)
        assert text in ("yes", "no") and reason == "eos", text
        text, _ = generate(llm, "Name a color.", colors, seed, 8)
        assert json.loads(text) in ("red", "green", "blue"), text


def test_chinese_characters_only(llm: Any) -> None:
    g = parse('root ::= [你好世界中文天气很]{2,8}')
    for seed in range(2):
        text, _ = generate(llm, "用中文说你好。", g, seed, 24)
        assert text and set(text) <= set("你好世界中文天气很") and len(text) <= 8, text


def test_python_api_grammar_and_response_format(llm: Any) -> None:
    import jsonschema

    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS[0]}}
    r = llm.create_chat_completion([{"role": "user", "content": "A person as JSON."}], response_format=fmt,
                                   max_tokens=150, seed=1)
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), SCHEMAS[0])
    r = llm.create_completion("Is fire hot?", grammar='root ::= " yes" | " no"', max_tokens=8, seed=2)
    assert r["choices"][0]["text"] in (" yes", " no") and r["choices"][0]["finish_reason"] == "stop", r


def test_sampler_checks_the_drawn_token_first(llm: Any) -> None:
    """Under a permissive grammar the full mask is rarely needed: most drawn tokens are allowed."""
    from edgellama.grammar import constrain
    from edgellama.sampling import Sampler, SamplerParams

    g = parse("root ::= [^\\x00]*")
    ids = llm.tokenizer.encode("Once upon a time")
    s = constrain(Sampler(SamplerParams(temp=0.8, seed=1), llm.n_ctx), g, llm.tokenizer)
    n = sum(1 for ev in llm.generate(ids, s, 16) if ev.kind == "token")
    assert n >= 8 and s.n_masked <= n // 4


def test_eos_only_where_the_grammar_may_end(smollm2_tokenizer: Any) -> None:
    tok = smollm2_tokenizer
    trie = VocabTrie([tok.token_bytes(i) for i in range(tok.n_vocab)])
    m = GrammarMatcher(parse('root ::= "ab" "c"?'), trie, set(tok.eot_ids))
    eos = next(iter(tok.eot_ids))
    assert not m.allows(eos) and not m.mask()[eos]
    for t in tok.encode("ab", add_special=False):
        m.accept(t)
    assert m.accepting and not m.done and m.allows(eos) and m.mask()[eos]
    m.accept(tok.encode("c", add_special=False)[0])
    assert m.done and DONE


# ---- the command line ----

def test_cli_grammar_flags(smollm2_path: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.service_util import cli_env

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "edgellama", "run", "-m", str(smollm2_path), "-t", "1",
                               "-c", "256", "--no-display-prompt", "-s", "3", *args],
                              capture_output=True, text=True, timeout=300, env=cli_env(), check=False)

    r = run("--chat", "-p", "Is the sky blue?", "--grammar-file", "yes_no", "-n", "8")
    assert r.returncode == 0 and r.stdout.strip() in ("yes", "no"), r.stderr
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMAS[0]))
    r = run("--chat", "-p", "A person as JSON", "-j", f"@{schema}", "-n", "120")
    assert r.returncode == 0, r.stderr
    import jsonschema

    jsonschema.validate(json.loads(r.stdout), SCHEMAS[0])
    r = run("-p", "x", "--grammar", 'root ::= "a"\nb ::= [z-a]')
    assert r.returncode != 0 and "line 2, column 7" in r.stderr and "reversed" in r.stderr, r.stderr
    r = run("-p", "x", "--grammar-file", "nope")
    assert r.returncode != 0 and "bundled grammars: arithmetic" in r.stderr, r.stderr
