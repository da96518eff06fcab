"""WordPiece (`tokenizer.ggml.model = bert`): llama.cpp's llm_tokenizer_wpm_session, for BERT-family
embedding models.

Words first (BertNormalizer and BertPreTokenizer as llama.cpp does them): with strip_accents the text is
NFD-decomposed and its marks (category M) dropped; whitespace (the Unicode White_Space set) ends a word;
U+0000, U+FFFD and controls (category C) are dropped; with lowercase each code point takes its simple
lowercase mapping; punctuation (P), ASCII symbols (S below U+007F) and CJK ideographs are words of one
character. Then each word, prefixed with U+2581 (how llama.cpp's converter stores a word start; "##"
continuations are stored without it), is cut greedily into the longest vocabulary pieces from the left;
a word with a position no piece starts at becomes one unknown token.

Python's unicodedata stands in for llama.cpp's generated tables (same categories, NFD and simple case
mappings; they can differ for code points a newer Unicode version assigns).
"""

from __future__ import annotations

import unicodedata

WORD_START = "\u2581"

# the White_Space property (llama.cpp's unicode whitespace table)
_WHITESPACE = frozenset(
    [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)
# SpecialCasing's one unconditional lowercase that is not one code point: its simple mapping
_LOWER_EXCEPTIONS = {"\u0130": "i"}


def _is_cjk(cp: int) -> bool:
    """llama.cpp's is_chinese_char (the CJK ideograph blocks BERT's tokenizer splits per character)."""
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F or 0x2B920 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )  # fmt: skip


def _lower(ch: str) -> str:
    low = ch.lower()
    return low if len(low) == 1 else _LOWER_EXCEPTIONS.get(ch, ch)


def wpm_words(text: str, lowercase: bool, strip_accents: bool) -> list[str]:
    """The words of text, normalized (see the module's docstring)."""
    if strip_accents:
        text = unicodedata.normalize("NFD", text)
    words: list[str] = []
    cur: list[str] = []
    for ch in text:
        cp = ord(ch)
        if cp in _WHITESPACE:
            if cur:
                words.append("".join(cur))
                cur = []
            continue
        cat = unicodedata.category(ch)
        if cp == 0 or cp == 0xFFFD or (cat[0] == "C" and cat != "Cn"):
            continue
        if strip_accents and cat[0] == "M":
            continue
        s = _lower(ch) if lowercase else ch
        if cat[0] == "P" or (cp < 0x7F and cat[0] == "S") or _is_cjk(cp):
            if cur:
                words.append("".join(cur))
                cur = []
            words.append(s)
        else:
            cur.append(s)
    if cur:
        words.append("".join(cur))
    return words


def wpm_tokenize(words: list[str], token_to_id: dict[str, int], max_len: int, unk_id: int) -> list[int]:
    """Each word as its longest-first vocabulary pieces (max_len: the longest token, in code points),
    or unk_id where some position of it starts no piece."""
    out: list[int] = []
    for word in words:
        w = WORD_START + word
        n, i, start = len(w), 0, len(out)
        while i < n:
            for j in range(min(n, i + max_len), i, -1):
                tid = token_to_id.get(w[i:j])
                if tid is not None:
                    out.append(tid)
                    i = j
                    break
            else:
                del out[start:]
                break
        if len(out) == start:
            out.append(unk_id)
    return out
