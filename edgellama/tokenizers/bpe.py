"""GPT-2 byte-level BPE: the byte<->unicode map and rank-ordered merges of one pre-tokenized word.

Mirrors llama.cpp's llm_tokenizer_bpe_session for one word; pre-tokenization lives in
pretokenize.py and special-token splitting in tokenizer.py. Results are cached per word.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence


def bytes_to_unicode() -> list[str]:
    """GPT-2's map: byte value -> the printable character that stands for it in the vocabulary."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_UNICODE = bytes_to_unicode()
UNICODE_TO_BYTE = {ch: b for b, ch in enumerate(BYTE_TO_UNICODE)}
# str.translate table: a latin-1 decoded byte string -> its byte-level characters
_LATIN1_TO_BYTE_LEVEL = {b: ch for b, ch in enumerate(BYTE_TO_UNICODE)}


def byte_encode(word: str) -> str:
    """`word`'s UTF-8 bytes spelled with the byte-level characters (what vocab entries look like)."""
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_BYTE_LEVEL)


def byte_decode(piece: str) -> bytes:
    """The bytes a byte-level vocab string stands for; characters outside the map pass as UTF-8."""
    out = bytearray()
    for ch in piece:
        b = UNICODE_TO_BYTE.get(ch)
        if b is None:
            out += ch.encode("utf-8", "surrogatepass")
        else:
            out.append(b)
    return bytes(out)


def parse_merges(merges: Sequence[str]) -> dict[tuple[str, str], int]:
    """`tokenizer.ggml.merges` ("left right" per line) -> rank; the first occurrence of a pair wins."""
    ranks: dict[tuple[str, str], int] = {}
    for i, line in enumerate(merges):
        # llama.cpp splits at the first space after position 0, so a left part may start with one
        pos = line.find(" ", 1)
        pair = (line[:pos], line[pos + 1 :]) if pos != -1 else ("", "")
        ranks.setdefault(pair, i)
    return ranks


class BPEMerger:
    """Merges the byte-level characters of a word by rank (lowest first, leftmost on ties)."""

    CACHE_LIMIT = 200_000  # words; a long-running service must not grow without bound

    def __init__(
        self,
        token_to_id: Mapping[str, int],
        ranks: Mapping[tuple[str, str], int],
        ignore_merges: bool = False,
    ) -> None:
        self.token_to_id = token_to_id
        self.ranks = ranks
        self.ignore_merges = ignore_merges
        self._cache: dict[str, tuple[int, ...]] = {}

    def word_ids(self, word: str) -> tuple[int, ...]:
        """Token ids of one pre-tokenized word (plain text, not yet byte-encoded)."""
        ids = self._cache.get(word)
        if ids is None:
            ids = self._merge(byte_encode(word))
            if len(word) <= 256:  # long words (runs, base64 blobs) rarely repeat: not worth memory
                if len(self._cache) >= self.CACHE_LIMIT:
                    self._cache.clear()
                self._cache[word] = ids
        return ids

    def _merge(self, enc: str) -> tuple[int, ...]:
        vocab = self.token_to_id
        if self.ignore_merges and enc in vocab:
            return (vocab[enc],)
        syms = _merge_short(list(enc), self.ranks) if len(enc) <= 32 else _merge_long(enc, self.ranks)
        out: list[int] = []
        for s in syms:
            tid = vocab.get(s)
            if tid is not None:
                out.append(tid)
                continue
            # llama.cpp: a symbol that is not a token is emitted byte by byte, each UTF-8 byte of
            # the byte-level string looked up as a one-character token (only ASCII bytes can match)
            for b in s.encode("utf-8"):
                t = vocab.get(chr(b)) if b < 0x80 else None
                if t is not None:
                    out.append(t)
        return tuple(out)


def _merge_short(syms: list[str], ranks: Mapping[tuple[str, str], int]) -> list[str]:
    # llama.cpp's priority queue always takes the valid adjacent pair of lowest (rank, position):
    # the same choice as this rescan, which is cheaper for the short words pre-tokenizers make.
    while len(syms) > 1:
        best = -1
        best_rank = 0
        for i in range(len(syms) - 1):
            r = ranks.get((syms[i], syms[i + 1]))
            if r is not None and (best < 0 or r < best_rank):
                best, best_rank = i, r
        if best < 0:
            break
        syms[best : best + 2] = [syms[best] + syms[best + 1]]
    return syms


def _merge_long(enc: str, ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """The same merges with llama.cpp's priority queue: O(n log n) for long words (runs, base64)."""
    n = len(enc)
    sym = list(enc)  # "" once merged into the left neighbour
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap: list[tuple[int, int, int, str]] = []
    for i in range(n - 1):
        r = ranks.get((sym[i], sym[i + 1]))
        if r is not None:
            heap.append((r, i, i + 1, sym[i] + sym[i + 1]))
    heapq.heapify(heap)
    while heap:
        _, left, right, text = heapq.heappop(heap)
        ls, rs = sym[left], sym[right]
        if not ls or not rs or ls + rs != text:  # stale: a side was merged since
            continue
        sym[left], sym[right] = text, ""
        r2 = nxt[right]
        nxt[left] = r2
        if r2 >= 0:
            prv[r2] = left
        p = prv[left]
        if p >= 0 and (r := ranks.get((sym[p], text))) is not None:
            heapq.heappush(heap, (r, p, left, sym[p] + text))
        if r2 >= 0 and (r := ranks.get((text, sym[r2]))) is not None:
            heapq.heappush(heap, (r, left, r2, text + sym[r2]))
    return [s for s in sym if s]
