"""The Python API as llama-cpp-python users write it: `from edgellama import LLM`, completions and chat
completions in their dict shapes (streamed or not), tokenize/detokenize; chat prompts rendered by the
GGUF's own template equal llama-cpp-python's, and SmolLM2's greedy answers equal llama.cpp's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REFERENCE_DIRS, REFERENCE_NUMERICS, ROOT, load_reference

from edgellama.gguf.reader import GGUFFile
from edgellama.llm import LLM
from edgellama.tokenizers.chat import JinjaChatTemplate, chat_formatter

# A llama-cpp-python script as its README shows them; only the import line is changed by the test.
LLAMA_CPP_SCRIPT = '''
from llama_cpp import Llama

llm = Llama(model_path=MODEL_PATH, n_ctx=512, n_threads=2, seed=1234, verbose=False, n_gpu_layers=-1)
output = llm("Q: Name the planets in the solar system? A: ", max_tokens=8, stop=["Q:", "\\n"], echo=True)
print(output["choices"][0]["text"])
print(output["choices"][0]["finish_reason"], output["usage"]["total_tokens"])
response = llm.create_chat_completion(
    messages=[
        {"role": "system", "content": "You are an assistant who perfectly describes images."},
        {"role": "user", "content": "Describe this image in detail please."},
    ],
    max_tokens=8,
)
print(response["choices"][0]["message"]["role"], len(response["choices"][0]["message"]["content"]) > 0)
for chunk in llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True):
    delta = chunk["choices"][0]["delta"]
    if "content" in delta:
        print(delta["content"], end="")
print()
tokens = llm.tokenize(b"Hello, world!")
print(llm.detokenize(tokens))
'''


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env,
                          cwd=ROOT, check=False)


def test_a_llama_cpp_python_script_runs_with_only_the_import_changed(smollm2_path: Path) -> None:
    script = LLAMA_CPP_SCRIPT.replace("from llama_cpp import Llama", "from edgellama import LLM as Llama")
    p = _python(f"MODEL_PATH = {str(smollm2_path)!r}\n" + script)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("Q: Name the planets in the solar system? A: ")
    assert lines[1].split()[0] in ("stop", "length") and int(lines[1].split()[1]) > 8
    assert lines[2] == "assistant True"
    assert lines[-1] == "b'Hello, world!'"


def test_the_readme_python_example_runs(smollm2_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    assert blocks, "README has no python example"
    p = _python(blocks[0])
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(" Paris stop {'prompt_tokens': 5, 'completion_tokens': 2, 'total_tokens': 7, "
                               "'prompt_tokens_details': {'cached_tokens': 0}}")


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> Any:
    with LLM(smollm2_path, n_ctx=1024, n_threads=2, numerics=REFERENCE_NUMERICS) as llm:
        yield llm


def test_chat_completions_equal_llama_cpp_greedy_answers(smol: LLM) -> None:
    """llama.cpp's create_chat_completion(max_tokens=32, temperature=0) on its five conversations:
    text, finish reason and usage (llama.cpp's numerics, so the tokens are its tokens)."""
    for case in load_reference("chat.json", REFERENCE_DIRS["smollm2"])["cases"]:
        r = smol.create_chat_completion(messages=case["messages"], max_tokens=32, temperature=0)
        assert r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant"
        assert r["choices"][0]["message"]["content"] == case["answer"], case["messages"]
        assert r["choices"][0]["finish_reason"] == case["finish_reason"]
        # llama-cpp-python's usage; llama-server's prompt_tokens_details comes beside it (one shaper for both)
        assert {k: r["usage"][k] for k in case["usage"]} == case["usage"]


def test_streams_give_the_same_text_as_whole_answers_and_stop_before_stop_strings(smol: LLM) -> None:
    whole = smol("The capital of France is", max_tokens=8, temperature=0, stop=["."])
    assert whole["object"] == "text_completion" and "." not in whole["choices"][0]["text"]
    chunks = list(smol("The capital of France is", max_tokens=8, temperature=0, stop=["."], stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"] == "stop"
    msgs = [{"role": "user", "content": "What is the capital of Japan?"}]
    chat = list(smol.create_chat_completion(messages=msgs, max_tokens=16, temperature=0, stream=True))
    assert chat[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert all(c["object"] == "chat.completion.chunk" for c in chat)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chat) == "The capital of Japan is Tokyo."
    assert chat[-1]["choices"][0]["finish_reason"] == "stop"


def test_tokenize_and_detokenize_as_llama_cpp_python(smol: LLM) -> None:
    assert smol.tokenize(b"Hello, world!") == smol.tokenize("Hello, world!")
    assert smol.detokenize(smol.tokenize("na\u00efve caf\u00e9")) == "na\u00efve caf\u00e9".encode()
    ids = smol.tokenize(b"<|im_start|>user", special=True)
    assert ids[0] == 1 and smol.detokenize(ids) == b"user"  # a control token has no text
    assert smol.create_completion(ids[:1] + smol.tokenize("Hi"), max_tokens=1, temperature=0)["usage"][
        "prompt_tokens"] == 1 + len(smol.tokenize("Hi"))


@pytest.mark.parametrize("name", ["smollm2", pytest.param("qwen", marks=pytest.mark.slow)])
def test_the_gguf_template_renders_what_llama_cpp_python_rendered(request: pytest.FixtureRequest, name: str) -> None:
    path = request.getfixturevalue(f"{name}_path")
    with GGUFFile(path) as f:
        fmt = chat_formatter(f.metadata)
    assert isinstance(fmt, JinjaChatTemplate)
    for case in load_reference("chat.json", REFERENCE_DIRS[name])["cases"]:
        assert fmt.render(case["messages"]) == case["prompt"]


def test_a_hostile_template_is_sandboxed_and_bounded() -> None:
    md = {"tokenizer.ggml.tokens": ["<s>", "</s>"], "tokenizer.ggml.bos_token_id": 0,
          "tokenizer.ggml.eos_token_id": 1}
    evil = chat_formatter({**md, "tokenizer.chat_template": "{{ messages.__class__.__mro__ }}"})
    with pytest.raises(ValueError, match="chat template"):
        evil.render([{"role": "user", "content": "x"}])
    big = chat_formatter({**md, "tokenizer.chat_template":
                          "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}"})
    with pytest.raises(ValueError, match="more than"):
        big.render([])
    refuse = chat_formatter({**md, "tokenizer.chat_template": "{{ raise_exception('no system role') }}"})
    with pytest.raises(ValueError, match="no system role"):
        refuse.render([])
    ok = chat_formatter({**md, "tokenizer.chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}"
                                                           "{% endfor %}{% if add_generation_prompt %}>{% endif %}"})
    assert ok.render([{"role": "user", "content": "hi"}]) == "<s>hi>"


def test_text_that_is_not_unicode_is_a_value_error_naming_the_field(smol: Any) -> None:
    """As every other door: a lone UTF-16 surrogate in the prompt, a stop string or a message is refused by
    name before anything is generated."""
    with pytest.raises(ValueError, match="field 'prompt' is not valid Unicode"):
        smol.create_completion("Hi \ud800", max_tokens=2)
    with pytest.raises(ValueError, match=r"field 'stop\[0\]' is not valid Unicode"):
        smol.create_completion("Hi", stop=["\udc00"], max_tokens=2)
    with pytest.raises(ValueError, match=r"field 'messages\[0\].content' is not valid Unicode"):
        smol.create_chat_completion([{"role": "user", "content": "\ud83d"}], max_tokens=2)
