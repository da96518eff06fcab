"""Pre-tokenizer splits for byte-level BPE vocabularies, the way llama.cpp's unicode_regex_split does them.

Splits text into words (no vocabulary here, no merges, no byte encoding); Python's ``re`` has no
``\\p{L}``, so, like llama.cpp, each code point >= 128 is first collapsed to one stand-in character
per Unicode category and the regexes are rewritten to match the stand-ins.

How llama.cpp splits (src/unicode.cpp), and so how this module does:
- a pre-tokenizer is a list of regexes applied in turn; each regex splits every segment left by
  the previous one, and the text between matches stays a segment of its own (nothing is dropped);
- ``\\p{N}`` ``\\p{L}`` ``\\p{P}`` ``\\p{M}`` ``\\p{S}`` become ``[<stand-in><ASCII members>]``; other
  code points >= 128 become 0xD0, whitespace >= 128 becomes 0x0B (so ``\\s`` keeps matching it);
- a regex without ``\\p{...}`` (DeepSeek's explicit code point ranges) runs on the text itself, with
  only whitespace >= 128 mapped to 0x0B;
- the GPT-2 and Llama-3 regexes run in llama.cpp as hand-written scanners; the regexes used here
  for them are the ones those scanners are equivalent to (GPT-2's gains the ``|\\s+`` its scanner has).
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from dataclasses import dataclass

# Unicode White_Space, the set llama.cpp's unicode-data.cpp was generated with (the `regex`
# module's \s). Python's str.isspace() differs: it also counts 0x1C-0x1F.
WHITESPACE = frozenset(
    [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B)]
    + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)

# Stand-ins and ASCII members per category: llama.cpp's k_ucat_cpt and k_ucat_map.
_CATEGORY_STANDIN = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
_CATEGORY_ASCII = {
    "N": "0-9",
    "L": "A-Za-z",
    "P": r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    "M": "",
    "S": r"\$\+<-\>\^`\|~",
}
# Which \p{...} names llama.cpp collapses, and to which category (Lu/Ll/... all become "letter").
_UCAT = {
    "N": "N",
    "L": "L",
    "P": "P",
    "M": "M",
    "S": "S",
    "Lu": "L",
    "Ll": "L",
    "Lt": "L",
    "Lm": "L",
    "Lo": "L",
}


class _CollapseTable(dict):  # type: ignore[type-arg]
    """str.translate table filled on first use: code point -> its category stand-in."""

    def __missing__(self, cp: int) -> str:
        if cp < 128:
            ch = chr(cp)
        elif cp in WHITESPACE:
            ch = "\x0b"
        else:
            ch = _CATEGORY_STANDIN.get(unicodedata.category(chr(cp))[0], "\xd0")
        self[cp] = ch
        return ch


class _WhitespaceTable(dict):  # type: ignore[type-arg]
    """For regexes without \\p{...}: only non-ASCII whitespace is replaced (llama.cpp's wregex path)."""

    def __missing__(self, cp: int) -> str:
        ch = "\x0b" if cp >= 128 and cp in WHITESPACE else chr(cp)
        self[cp] = ch
        return ch


_COLLAPSE = _CollapseTable()
_WS_ONLY = _WhitespaceTable()


def collapse(text: str) -> str:
    """The text with every code point >= 128 replaced by its category stand-in (same length)."""
    return text if text.isascii() else text.translate(_COLLAPSE)


def translate_regex(expr: str) -> str:
    """Rewrite \\p{X} into classes over the collapsed text, exactly as llama.cpp does."""
    out: list[str] = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append(c)
            inside = True
            i += 1
            continue
        if inside and c == "]" and expr[i - 1] != "\\":
            out.append(c)
            inside = False
            i += 1
            continue
        if c == "\\" and expr.startswith("p{", i + 1):
            close = expr.find("}", i + 3)
            name = expr[i + 3 : close] if close != -1 else ""
            if name in _UCAT:
                cat = _UCAT[name]
                body = _CATEGORY_STANDIN[cat] + _CATEGORY_ASCII[cat]
                out.append(body if inside else "[" + body + "]")
                i = close + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_ORIGINAL = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]"
    r"|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]"
    r"|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+"
    r"((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PUNCT_RUN = r"[\p{P}\$\+<=>\^~\|]+"
# falcon's punctuation run also takes the backtick
FALCON_PUNCT_RUN = r"[\p{P}\$\+<=>\^~\|`]+"

# DeepSeek's splits spell their letter, punctuation and CJK classes as explicit code point ranges
# (no \p{...}), so llama.cpp runs them on the text itself, not on the collapsed stand-ins; only
# their \p{N} passes and deepseek-coder's \p{L}/\p{P} passes use the collapsed text.
DEEPSEEK_LETTERS = (
    r"\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    r"\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    r"\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf"
    r"\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57"
    r"\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    r"\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124"
    r"\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b"
    r"\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    r"\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    r"\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)
DEEPSEEK_PUNCT = r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
# CJK ideographs, all of U+0800..U+4E00 (Indic, Thai, Georgian, kana, CJK punctuation...) and Hangul
DEEPSEEK_CJK = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# llama.cpp's "\s+$": std::regex sees one segment at a time, and its `$` is that segment's end and
# nothing else; `\Z` is that in Python (`$` would also match before a final newline)
DEEPSEEK_TRAILING_SPACE = r"\s+\Z"

# llama.cpp's hand-written scanners, by the regex string that selects them, and the regex each is
# equivalent to (the GPT-2 scanner also matches a lone whitespace run: the trailing `|\s+`).
SCANNER_EQUIVALENT = {GPT2: GPT2 + r"|\s+", LLAMA3: LLAMA3, LLAMA3_ORIGINAL: LLAMA3}


@dataclass(frozen=True)
class PreTokenizerSpec:
    """One `tokenizer.ggml.pre` family: its regexes and the vocab flags llama.cpp sets with it."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word that is itself a token skips the merges (llama3, tekken)
    add_bos_default: bool = False  # llama.cpp's default when tokenizer.ggml.add_bos_token is absent


_DEFAULT = PreTokenizerSpec((PUNCT_RUN, GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))
_GPT2 = PreTokenizerSpec((GPT2,))
_LLAMA3 = PreTokenizerSpec((LLAMA3,), ignore_merges=True, add_bos_default=True)
_QWEN2 = PreTokenizerSpec((QWEN2,))
_STARCODER = PreTokenizerSpec((r"\p{N}", GPT2))

# Names and families from llama.cpp's llama_vocab::impl::load and llm_tokenizer_bpe. Checked case by
# case on llama.cpp's vocab files (tests/test_tokenizer_vocabs.py): gpt-2, llama-bpe, qwen2, qwen35, falcon,
# mpt, starcoder, refact, command-r, deepseek-llm, deepseek-coder; default, smollm and the Qwen and Llama 3
# regexes against the `regex` module (tests/test_tokenizer.py); the others follow the same table.
PRE_TOKENIZERS: dict[str, PreTokenizerSpec] = {
    "default": _DEFAULT,
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0"], _LLAMA3
    ),
    "lfm2": _LLAMA3,
    **dict.fromkeys(["dbrx", "smaug-bpe", "glm4", "chatglm-bpe"], PreTokenizerSpec((LLAMA3,))),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan"], _QWEN2),
    "qwen35": PreTokenizerSpec((QWEN35,)),
    **dict.fromkeys(
        ["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum"],
        _GPT2,
    ),
    **dict.fromkeys(["modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4"], _GPT2),
    **dict.fromkeys(["roberta-bpe", "jina-v1-en", "jina-v2-code"], _GPT2),
    **dict.fromkeys(
        ["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"],
        _STARCODER,
    ),
    "falcon": PreTokenizerSpec((FALCON_PUNCT_RUN, GPT2, "[0-9][0-9][0-9]")),
    **dict.fromkeys(["gpt-4o", "llama4"], PreTokenizerSpec((GPT4O,))),
    "tekken": PreTokenizerSpec((TEKKEN,), ignore_merges=True, add_bos_default=True),
    **dict.fromkeys(
        ["poro-chat", "bloom", "gpt3-finnish"], PreTokenizerSpec((r" ?[^(\s|.,!?…。，、।۔،)]+",))
    ),
    "deepseek-llm": PreTokenizerSpec(
        (r"[\r\n]", DEEPSEEK_LETTERS, DEEPSEEK_PUNCT, DEEPSEEK_TRAILING_SPACE, DEEPSEEK_CJK, r"\p{N}+")
    ),
    "deepseek-coder": PreTokenizerSpec((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK, r"\p{N}")),
}


class PreTokenizer:
    """Splits text into words with one `tokenizer.ggml.pre` family's regexes."""

    def __init__(self, name: str) -> None:
        spec = PRE_TOKENIZERS.get(name)
        if spec is None:
            raise ValueError(f"unsupported pre-tokenizer tokenizer.ggml.pre = {name!r}")
        self.name = name
        self.spec = spec
        # (compiled pattern, runs on the collapsed text?) per regex, in order
        self._passes: list[tuple[re.Pattern[str], bool]] = []
        for expr in spec.regexes:
            expr = SCANNER_EQUIVALENT.get(expr, expr)
            uses_category = "\\p{" in expr
            if uses_category and not expr.isascii():
                raise ValueError(f"regex mixes \\p{{...}} and non-ASCII characters: {expr!r}")
            src = translate_regex(expr) if uses_category else expr
            # ASCII: \s is C's isspace, as in std::regex (non-ASCII whitespace was mapped to 0x0B)
            self._passes.append((re.compile(src, re.ASCII), uses_category))

    def split(self, text: str) -> list[str]:
        """The words of `text`, in order; their concatenation is `text`."""
        if not text:
            return []
        collapsed: str | None = None
        ws_only: str | None = None
        bounds = [0, len(text)]  # segment i is text[bounds[i]:bounds[i+1]]
        for pattern, on_collapsed in self._passes:
            if on_collapsed:
                if collapsed is None:
                    collapsed = collapse(text)
                subject = collapsed
            else:
                if ws_only is None:
                    ws_only = text if text.isascii() else text.translate(_WS_ONLY)
                subject = ws_only
            new_bounds = [0]
            for a, b in itertools.pairwise(bounds):
                pos = a
                for m in pattern.finditer(subject, a, b):
                    s, e = m.span()
                    if s == e:  # llama.cpp never yields empty words
                        continue
                    if s > pos:
                        new_bounds.append(s)
                    new_bounds.append(e)
                    pos = e
                if pos < b:
                    new_bounds.append(b)
            bounds = new_bounds
        return [text[a:b] for a, b in itertools.pairwise(bounds)]
