"""edgellama.generation without a model: the one Generation object (stop strings across tokens, reverse
prompts kept, an incomplete UTF-8 tail never sent as U+FFFD, end-of-text, grammar completion, limits,
non-finite logits) and the one request-parameter table (edgellama.params) as each front end names it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edgellama import params as R
from edgellama.generation import Generation, NonFiniteLogits, StopStrings, build_sampler
from tests.fake_engine import EOS, N_VOCAB, FakeTokenizer


class Scripted:
    """A sampler that draws the given tokens in order, whatever the logits."""

    def __init__(self, tokens: list[int], finished_after: int | None = None) -> None:
        self.tokens, self.n, self.finished_after = list(tokens), 0, finished_after
        self.accepted: list[int] = []

    def sample(self, logits: Any) -> int:
        self.n += 1
        return self.tokens[self.n - 1]

    def accept(self, token: int) -> None:
        self.accepted.append(token)

    @property
    def finished(self) -> bool:
        return self.finished_after is not None and self.n >= self.finished_after


def toks(text: str) -> list[int]:
    return FakeTokenizer().encode(text)


def drive(tokens: list[int], **kwargs: Any) -> tuple[Generation, list[str], str]:
    sent: list[str] = []
    gen = Generation(FakeTokenizer(), toks("prompt"), Scripted(tokens, kwargs.pop("finished_after", None)),
                     emit=lambda text, tok: sent.append(text), **kwargs)
    logits = np.zeros(N_VOCAB, np.float32)
    while gen.step(logits) is not None:
        pass
    tail = gen.finish()
    return gen, sent, tail


def test_an_incomplete_character_at_the_token_limit_is_dropped_not_sent_as_u_fffd() -> None:
    star = toks("🌟")  # four byte tokens
    gen, sent, tail = drive(star * 2 + star[:2], n_predict=10)
    assert "".join(sent) + tail == "🌟🌟" and gen.stop_reason == "length"
    assert "\ufffd" not in "".join(sent) + tail


def test_stop_strings_across_tokens_are_held_back_and_cut() -> None:
    gen, sent, tail = drive(toks("Hello world! more"), stops=["world!"])
    assert "".join(sent) + tail == "Hello " and gen.stop_reason == "stop" and gen.stop_hit == "world!"
    assert all("w" not in s for s in sent)  # never half sent


def test_a_reverse_prompt_is_kept_in_the_text_when_asked() -> None:
    gen, sent, tail = drive(toks("Hi User: x"), stops=["User:"], keep_stop=True)
    assert "".join(sent) + tail == "Hi User:" and gen.stop_reason == "stop"


def test_a_held_back_prefix_is_released_at_the_end() -> None:
    gen, sent, tail = drive(toks("abc wor") + [EOS], stops=["world"])
    assert "".join(sent) == "abc " and tail == "wor" and gen.stop_reason == "eos"


def test_end_of_text_grammar_completion_and_zero_tokens() -> None:
    gen, sent, _ = drive(toks("ab") + [EOS, 5])
    assert "".join(sent) == "ab" and gen.stop_reason == "eos" and gen.n_predicted == 3
    gen, sent, _ = drive(toks("abcdef"), finished_after=2)
    assert "".join(sent) == "ab" and gen.stop_reason == "eos"
    gen, sent, _ = drive(toks("ab"), n_predict=0)
    assert sent == [] and gen.stop_reason == "length" and gen.n_predicted == 0


def test_non_finite_logits_are_refused_naming_the_model() -> None:
    gen = Generation(FakeTokenizer(), toks("p"), Scripted(toks("a")), model="broken.gguf")
    logits = np.zeros(N_VOCAB, np.float32)
    logits[7] = np.nan
    with pytest.raises(NonFiniteLogits, match="broken.gguf"):
        gen.step(logits)
    logits[7] = np.inf
    with pytest.raises(NonFiniteLogits):
        gen.step(logits)


def test_ignore_eos_never_samples_end_of_text() -> None:
    logits = np.zeros(N_VOCAB, np.float32)
    logits[EOS] = 100.0
    s = build_sampler(R.GenParams(temperature=0, ignore_eos=True), FakeTokenizer(), 64)  # type: ignore[arg-type]
    assert s.sample(logits) != EOS
    s = build_sampler(R.GenParams(temperature=0), FakeTokenizer(), 64)  # type: ignore[arg-type]
    assert s.sample(logits) == EOS


@pytest.mark.parametrize(("front", "name"), [(R.CLI, "--top-p"), (R.V1, "'top_p'"), (R.OPENAI, "'top_p'"),
                                             (R.PYTHON, "'top_p'")])
def test_one_rule_named_as_each_front_end_spells_it(front: str, name: str) -> None:
    with pytest.raises(R.ParamError) as e:
        R.check(R.GenParams(top_p=1.5), front)
    assert str(e.value) == f"{name} must be in [0, 1]" and e.value.field == "top_p"


@pytest.mark.parametrize(("values", "words"), [
    ({"n_predict": -2}, "must be >= -1"), ({"n_predict": 1 << 31}, "must be at most 2147483647"),
    ({"temperature": float("nan")}, "finite"), ({"temperature": -0.5}, ">= 0"),
    ({"repeat_penalty": 0.0}, "> 0"), ({"mirostat": 1}, "one of 0, 2"), ({"seed": -2}, "0..2^64-1"),
    ({"seed": 1 << 64}, "2^64"), ({"top_k": True}, "integer"), ({"stop": [""]}, "non-empty"),
    ({"stop": ["x"] * 17}, "up to 16"), ({"ignore_eos": 1}, "true or false"),
])
def test_the_table_refuses_what_the_engine_cannot_take(values: dict[str, Any], words: str) -> None:
    with pytest.raises(R.ParamError, match=words.replace("^", r"\^")):
        R.update(R.GenParams(), values, R.V1)


def test_the_openai_spelling_and_the_defaults() -> None:
    assert R.names(R.OPENAI)["max_tokens"] == "n_predict" and R.names(R.CLI)["--mirostat-ent"] == "mirostat_tau"
    p = R.update(R.GenParams(), {"seed": -1, "stop": "x", "temperature": 1}, R.V1)
    assert p.seed is None and p.stop == ["x"] and isinstance(p.temperature, float)
    assert StopStrings(["a"]).split("xa", final=True) == ("x", "", "a")
