"""Protocol v1 parsing and the stop-string hold-back, without a server (the server tests cover the wire)."""

from __future__ import annotations

import pytest

from edgellama.service import protocol as P
from edgellama.service.scheduler import _split_stop


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
])
def test_bad_requests_name_the_problem(line: bytes, words: str) -> None:
    with pytest.raises(P.ProtocolError) as e:
        P.parse_line(line)
    assert e.value.code == P.BAD_REQUEST and words in str(e.value)


def test_stop_strings_are_held_back_until_decided() -> None:
    assert _split_stop("Hello wor", ["world!"], final=False) == ("Hello ", "wor", False)
    assert _split_stop("Hello world!", ["world!"], final=False) == ("Hello ", "", True)
    assert _split_stop("Hello wor", ["world!"], final=True) == ("Hello wor", "", False)
    assert _split_stop("abc", [], final=False) == ("abc", "", False)
    assert _split_stop("x END y", ["END", "y"], final=False) == ("x ", "", True)  # the earliest stop wins
