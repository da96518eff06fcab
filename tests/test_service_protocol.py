"""Protocol v1 parsing and the stop-string hold-back, without a server (the server tests cover the wire)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from edgellama.generation import StopStrings
from edgellama.params import INT32_MAX
from edgellama.service import protocol as P


def test_a_completion_request_takes_llama_cpp_names() -> None:
    r = P.parse_line(b'{"id": "a", "prompt": "hi", "n_predict": 5, "temperature": 0, "top_k": 1, "top_p": 0.5,'
                     b' "min_p": 0.1, "repeat_penalty": 1.1, "seed": 7, "stop": "\\n", "stream": false}')
    assert isinstance(r, P.Completion)
    assert (r.id, r.prompt, r.n_predict, r.temperature, r.top_k, r.seed, r.stop, r.stream) == (
        "a", "hi", 5, 0, 1, 7, ["\n"], False)


def test_control_requests() -> None:
    assert P.parse_line(b'{"type": "health"}') == P.Control("health", None)
    assert P.parse_line(b'{"type": "cancel", "id": 3}') == P.Control("cancel", 3)


@pytest.mark.parametrize(("line", "words"), [
    (b'{"prompt": "x"}', "needs an 'id'"),
    (b'{"id": true, "prompt": "x"}', "'id' must be"),
    (b'{"id": 1}', "exactly one of"),
    (b'{"id": 1, "prompt": "x", "messages": []}', "exactly one of"),
    (b'{"id": 1, "prompt": "x", "n_predict": true}', "'n_predict' must be an integer"),
    (b'{"id": 1, "prompt": "x", "temperature": "hot"}', "'temperature' must be a number"),
    (b'{"id": 1, "prompt": "x", "stop": [""]}', "'stop'"),
    (b'{"id": 1, "messages": [{"role": "robot", "content": "x"}]}', "unknown role"),
    (b'{"type": "cancel"}', "cancel needs"),
    (b'{"type": "reboot", "id": 1}', "unknown type"),
    (b'{"id": 1, "prompt": "x", "n_predict": -2}', "n_predict"),
    (b'"just a string"', "JSON object"),
    (b'\xc3\x28', "UTF-8"),
    (b'{"id": 1, "prompt": "x", "temperature": NaN}', "NaN is not a JSON number"),
    (b'{"id": 1, "prompt": "x", "top_p": -Infinity}', "-Infinity is not a JSON number"),
    (b'{"id": 1, "prompt": "x", "repeat_penalty": 1e999}', "'repeat_penalty' must be a finite number"),
    (b'{"id": 1, "prompt": "x", "top_k": 2147483648}', "'top_k' must be at most"),
    (b'{"id": 1, "prompt": "x", "n_predict": 99999999999999999999}', "'n_predict' must be at most"),
    (b'{"id": 1, "prompt": "x", "seed": ' + b"9" * 5000 + b"}", "not JSON this server takes"),
    (b'{"id": 1, "prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}", "nested too deep"),
])
def test_bad_requests_name_the_problem(line: bytes, words: str) -> None:
    with pytest.raises(P.ProtocolError) as e:
        P.parse_line(line)
    assert e.value.code == P.BAD_REQUEST and words in str(e.value)


def test_stop_strings_are_held_back_until_decided() -> None:
    assert StopStrings(["world!"]).split("Hello wor", final=False) == ("Hello ", "wor", None)
    assert StopStrings(["world!"]).split("Hello world!", final=False) == ("Hello ", "", "world!")
    assert StopStrings(["world!"]).split("Hello wor", final=True) == ("Hello wor", "", None)
    assert StopStrings([]).split("abc", final=False) == ("abc", "", None)
    assert StopStrings(["END", "y"]).split("x END y", final=False) == ("x ", "", "END")  # the earliest stop wins


def _mutations(rng: random.Random) -> list[Any]:
    return [None, True, False, 0, -1, 1, 2**31, -2**31 - 1, 2**63, 2**64, 10**30, -10**30, 0.5, -0.5, 1e308,
            -1e308, 5e-324, "", "x", "\x1b[2J", [], [1], ["a", ""], {}, {"role": "user"}, rng.random() * 10,
            rng.randint(-10**6, 10**6), float("nan"), float("inf"), float("-inf"), BIG]


BIG = "__1e999__"  # written into the line as 1e999: a JSON number that reads as infinity
FUZZ_FIELDS = ["id", "type", "prompt", "messages", "stream", "cache_prompt", "special", *P.PARAM_FIELDS,
               "unknown_field"]


def test_fuzzed_requests_are_served_or_refused_by_name() -> None:
    """Issue 15's standard for the service's input: every field given every JSON type and extreme values (one
    or two at a time, 3,000 requests): parse_line refuses it with a bad_request, or what it accepts is
    something the sampler takes (Sampler(...)) and the engine's integer fields hold."""
    from edgellama.sampling import Sampler

    rng = random.Random(15)
    accepted = refused = 0
    for _ in range(3000):
        obj: dict[str, Any] = {"id": "f", "prompt": "hi"}
        for _k in range(rng.choice((1, 1, 2))):
            obj[rng.choice(FUZZ_FIELDS)] = rng.choice(_mutations(rng))
        if rng.random() < 0.1:
            obj.pop(rng.choice(list(obj)), None)
        line = json.dumps(obj).replace(f'"{BIG}"', "1e999").encode()
        try:
            r = P.parse_line(line)
        except P.ProtocolError as exc:
            assert exc.code == P.BAD_REQUEST and str(exc), line
            refused += 1
            continue
        accepted += 1
        if isinstance(r, P.Completion):
            Sampler(r)  # a Completion is the request parameters: the sampler checks them by the same table
            assert -1 <= r.n_predict <= INT32_MAX
    assert accepted > 100 and refused > 1000, (accepted, refused)

