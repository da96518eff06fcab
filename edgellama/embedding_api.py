"""llama-cpp-python's embedding calls on an LLM (mixed into it, as completion.CompletionAPI is): embed,
create_embedding (OpenAI's shape), and rerank. The work is LLM.embed_tokens (edgellama.embedding)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from edgellama.embedding import EmbeddingError, check_token_ids, rerank_tokens

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np
    import numpy.typing as npt

    from edgellama.embedding import Embedder
    from edgellama.tokenizers.tokenizer import Tokenizer

Input = str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]]


class EmbeddingAPI:
    """Mixed into LLM. Defaults are llama-cpp-python's."""

    if TYPE_CHECKING:  # what LLM provides
        tokenizer: Tokenizer
        path: Path
        pooling: str
        embedder: Embedder

        @property
        def n_vocab(self) -> int: ...
        def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]: ...
        def embed_tokens(self, texts: Sequence[Sequence[int]], embd_normalize: int = 2
                         ) -> list[npt.NDArray[np.float32]]: ...

    def _embed_input(self, input: Input, truncate: bool
                     ) -> tuple[list[list[int]], bool]:
        """Token lists of an input as llama-cpp-python and OpenAI take it (a string, strings, a token
        list, token lists) and whether it was a single one."""
        if isinstance(input, str):
            items: list[Any] = [input]
            single = True
        else:
            items = list(input)
            single = bool(items) and all(isinstance(x, int) for x in items)
            if single:
                items = [items]
        texts = [self.tokenize(x) if isinstance(x, str) else [int(t) for t in x] for x in items]
        check_token_ids(texts, self.n_vocab)
        if truncate:
            texts = [t[:self.embedder.max_tokens] for t in texts]
        return texts, single

    def embed(self, input: Input, normalize: bool = False,
              truncate: bool = True, return_count: bool = False) -> Any:
        """llama-cpp-python's Llama.embed: a list of floats for one input, a list of them for several
        (pooling none: a list per token); normalize: euclidean; truncate: cut each text to the context
        (else a longer one raises EmbeddingError); return_count: also the number of tokens."""
        texts, single = self._embed_input(input, truncate)
        vecs = self.embed_tokens(texts, 2 if normalize else -1)
        out = [v.tolist() for v in vecs]
        result = out[0] if single else out
        return (result, sum(len(t) for t in texts)) if return_count else result

    def rerank(self, query: str, documents: Sequence[str]) -> list[float]:
        """A relevance score of each document for query (pooling rank: a reranker's classification head on
        llama-server's query/document input); higher is more relevant."""
        if self.pooling != "rank":
            raise EmbeddingError("reranking needs pooling 'rank' and a reranker model (LLM(..., pooling='rank'))")
        texts = [rerank_tokens(self.tokenizer, query, d) for d in documents]
        return [float(v[0]) for v in self.embed_tokens(texts, -1)]

    def create_embedding(self, input: Input,
                         model: str | None = None) -> dict[str, Any]:
        """llama-cpp-python's (and OpenAI's) embedding response: data[i].embedding per input, usage."""
        texts, _ = self._embed_input(input, truncate=True)
        vecs = self.embed_tokens(texts, -1)
        n = sum(len(t) for t in texts)
        return {"object": "list", "model": model or self.path.name,
                "data": [{"object": "embedding", "embedding": v.tolist(), "index": i} for i, v in enumerate(vecs)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}

