"""SentencePiece-style (llama.cpp "SPM") tokenization of one text fragment: score-driven bigram merges.

Mirrors llama.cpp's llm_tokenizer_spm_session; whitespace escaping, the space prefix and special
tokens are handled by the caller (tokenizer.py). Pure Python over plain lists and dicts.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence


def spm_tokenize(
    text: str,
    token_to_id: Mapping[str, int],
    scores: Sequence[float],
    byte_ids: Sequence[int | None],
) -> list[int]:
    """Token ids of `text` (already escaped: spaces are U+2581).

    Start from one symbol per character; repeatedly merge the adjacent pair whose concatenation is
    a token with the highest score (leftmost on ties); symbols that end up not being tokens fall
    back to their UTF-8 bytes as `<0xNN>` tokens (`byte_ids[b]`).
    """
    n = len(text)
    if n == 0:
        return []
    sym = list(text)  # symbol text; "" once merged into its left neighbour
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    get = token_to_id.get

    # heap entries: (-score, left, right, merged text); a popped entry is stale unless both
    # symbols still hold exactly the text it was made from (llama.cpp's size check is the same test)
    heap: list[tuple[float, int, int, str]] = []
    for i in range(n - 1):
        t = sym[i] + sym[i + 1]
        tid = get(t)
        if tid is not None:
            heap.append((-scores[tid], i, i + 1, t))
    heapq.heapify(heap)
    push, pop = heapq.heappush, heapq.heappop

    while heap:
        _, left, right, t = pop(heap)
        ls, rs = sym[left], sym[right]
        if not ls or not rs or len(ls) + len(rs) != len(t):
            continue
        sym[left] = t
        sym[right] = ""
        r2 = nxt[right]
        nxt[left] = r2
        if r2 >= 0:
            prv[r2] = left
        p = prv[left]
        if p >= 0:
            t2 = sym[p] + t
            tid = get(t2)
            if tid is not None:
                push(heap, (-scores[tid], p, left, t2))
        if r2 >= 0:
            t2 = t + sym[r2]
            tid = get(t2)
            if tid is not None:
                push(heap, (-scores[tid], left, r2, t2))

    out: list[int] = []
    i = 0
    while i != -1:
        s = sym[i]
        tid = get(s)
        if tid is not None:
            out.append(tid)
        else:
            for b in s.encode("utf-8", "surrogatepass"):
                bid = byte_ids[b]
                if bid is None:
                    raise ValueError(f"vocabulary has no byte token for 0x{b:02X} (needed for {s!r})")
                out.append(bid)
        i = nxt[i]
    return out
