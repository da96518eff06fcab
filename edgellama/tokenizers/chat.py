"""Chat turn formats: the model's own template family, picked from GGUF metadata.

Only formatting lives here (text in, prompt text out); templates are not executed as Jinja.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChatFormat:
    name: str
    system: str  # with {content}
    user: str
    assistant_prefix: str
    assistant_suffix: str  # closes a finished assistant turn in the history
    stop_pieces: tuple[str, ...]

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        out = []
        pending_system = ""
        for m in messages:
            role, content = m.get("role", "user"), m.get("content", "")
            if role == "system":
                if self.name == "gemma":
                    pending_system += content + "\n\n"  # Gemma has no system turn: prefix the first user turn
                else:
                    out.append(self.system.format(content=content))
            elif role == "user":
                out.append(self.user.format(content=pending_system + content))
                pending_system = ""
            elif role == "assistant":
                out.append(self.assistant_prefix + content + self.assistant_suffix)
            else:
                raise ValueError(f"unknown chat role {role!r}")
        if add_generation_prompt:
            out.append(self.assistant_prefix)
        return "".join(out)


GEMMA = ChatFormat(
    name="gemma",
    system="",
    user="<start_of_turn>user\n{content}<end_of_turn>\n",
    assistant_prefix="<start_of_turn>model\n",
    assistant_suffix="<end_of_turn>\n",
    stop_pieces=("<end_of_turn>",),
)
CHATML = ChatFormat(
    name="chatml",
    system="<|im_start|>system\n{content}<|im_end|>\n",
    user="<|im_start|>user\n{content}<|im_end|>\n",
    assistant_prefix="<|im_start|>assistant\n",
    assistant_suffix="<|im_end|>\n",
    stop_pieces=("<|im_end|>",),
)
FORMATS = {"gemma": GEMMA, "chatml": CHATML}


def chat_format_for(md: dict[str, Any]) -> ChatFormat:
    tmpl = md.get("tokenizer.chat_template")
    if isinstance(tmpl, str):
        if "<start_of_turn>" in tmpl:
            return GEMMA
        if "<|im_start|>" in tmpl:
            return CHATML
    arch = md.get("general.architecture")
    if arch in ("gemma", "gemma2", "gemma3"):
        return GEMMA
    if arch in ("qwen2", "qwen3") or tmpl is None:
        return CHATML
    return CHATML
