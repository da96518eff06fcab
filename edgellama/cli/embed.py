"""`edgellama embed`: llama-embedding's job. The prompt (-p or -f) is split at --embd-separator (a line
each by default) into texts; each gets one vector (pooled, normalized), printed as text (the first and
last values, then the cosine similarities), a JSON array (`array`) or OpenAI's embedding list (`json`;
`json+` adds the cosine similarity matrix).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edgellama.cli.common import add_model_args, load

OUTPUT_FORMATS = ("", "array", "json", "json+")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("embed", help="embeddings of texts (llama-embedding)", description=__doc__)
    add_model_args(p)
    p.add_argument("-p", "--prompt", help="the text(s), split at --embd-separator")
    p.add_argument("-f", "--file", help="read the text(s) from a file")
    p.add_argument("--embd-separator", default="\n", metavar="SEP",
                   help="separates the texts in the prompt (default: a newline; escapes such as \\n are read)")
    p.add_argument("--embd-normalize", type=int, default=2, metavar="N",
                   help="-1 none, 0 max absolute (int16 range), 1 taxicab, 2 euclidean (default), >2 p-norm")
    p.add_argument("--embd-output-format", choices=OUTPUT_FORMATS, default="", metavar="FMT",
                   help="'' text (default), 'array' (a JSON array of vectors), 'json' (OpenAI's list), "
                        "'json+' (and the cosine similarities)")
    p.add_argument("--pooling", choices=("none", "mean", "cls", "last", "rank"), default=None,
                   help="how token vectors become one per text (default: the model's, else none); rank: a "
                        "reranker's score(s) of each text")
    p.add_argument("--parallel", "-np", type=int, default=None,
                   help="texts evaluated together in one forward pass (default: 4)")
    p.set_defaults(handler=run, embedding=True)


def _texts(args: argparse.Namespace) -> list[str]:
    if (args.prompt is None) == (args.file is None):
        raise ValueError("give the text(s) with exactly one of -p/--prompt and -f/--file")
    if args.file is not None:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    else:
        text = args.prompt
    sep = args.embd_separator.encode("utf-8").decode("unicode_escape") if "\\" in args.embd_separator \
        else args.embd_separator
    if not sep:
        raise ValueError("--embd-separator must not be empty")
    texts = [t for t in text.split(sep) if t.strip()]
    if not texts:
        raise ValueError("no text to embed (the prompt is empty)")
    return texts


def run(args: argparse.Namespace) -> int:
    from edgellama.embedding import cosine

    texts = _texts(args)
    if args.parallel is not None and not 1 <= args.parallel <= 256:
        raise ValueError(f"--parallel {args.parallel} is out of range (1..256)")
    with load(args) as llm:
        toks = [llm.tokenize(t, add_bos=True, special=True) for t in texts]
        vecs = llm.embed_tokens(toks, args.embd_normalize)
    out = sys.stdout
    fmt = args.embd_output_format
    if fmt == "array":
        json.dump([v.tolist() for v in vecs], out)
        out.write("\n")
        return 0
    pooled = vecs[0].ndim == 1
    if fmt in ("json", "json+"):
        doc: dict[str, Any] = {"object": "list", "data": [
            {"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vecs)]}
        if fmt == "json+" and pooled and len(vecs) > 1:
            doc["cosineSimilarity"] = [[round(cosine(a, b), 6) for b in vecs] for a in vecs]
        json.dump(doc, out)
        out.write("\n")
        return 0
    for i, v in enumerate(vecs):
        rows = [v] if pooled else list(v)
        for j, r in enumerate(rows):
            label = f"embedding {i}" if pooled else f"embedding {i} token {j}"
            vals = " ".join(f"{x:9.6f}" for x in (r if r.size <= 6 else [*r[:3]]))
            tail = "" if r.size <= 6 else " ... " + " ".join(f"{x:9.6f}" for x in r[-3:])
            out.write(f"{label}: {vals}{tail}\n")
    if pooled and len(vecs) > 1:
        out.write("\ncosine similarity matrix:\n\n")
        for a in vecs:
            out.write(" ".join(f"{cosine(a, b):6.2f}" for b in vecs) + "\n")
    return 0
