"""A Hugging Face model folder as llama.cpp's converter reads it: config.json, the weights
(model.safetensors, or model-*.safetensors shards), the vocabulary (tokenizer.json, else vocab.txt),
the special tokens (gguf-py's SpecialVocab rules) and sentence-transformers' pooling.

Only files are read; nothing is imported from or run out of the folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgellama.convert.safetensors import SafetensorsFile

# gguf's TokenType
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# llama.cpp's pooling types (bert.pooling_type)
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


class ConvertError(ValueError):
    """A folder this converter cannot turn into a GGUF (missing or malformed files, an unknown model)."""


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConvertError(f"{path}: cannot read it as JSON ({exc})") from None


def load_config(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such directory (want a Hugging Face model folder)")
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (want a Hugging Face model folder)")
    config = read_json(path)
    if not isinstance(config, dict):
        raise ConvertError(f"{path}: not a JSON object")
    if isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    return config


def find_hparam(config: dict[str, Any], keys: list[str], optional: bool = False) -> Any:
    for k in keys:
        if k in config:
            return config[k]
    if optional:
        return None
    raise ConvertError(f"config.json has none of {', '.join(keys)}")


def weight_files(folder: Path) -> list[SafetensorsFile]:
    """The safetensors parts in llama.cpp's order: the names model*.safetensors, sorted."""
    names = sorted(p.name for p in folder.iterdir() if p.name.startswith("model") and p.name.endswith(".safetensors"))
    if not names:
        bins = sorted(p.name for p in folder.glob("pytorch_model*.bin"))
        if bins:
            raise ConvertError(f"{folder}: only PyTorch pickles ({', '.join(bins)}); convert them to safetensors "
                               "first (a pickle can run code, so it is not read here)")
        raise FileNotFoundError(f"{folder}: no model.safetensors")
    index = folder / "model.safetensors.index.json"
    files = [SafetensorsFile(folder / n) for n in names]
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ConvertError(f"{index}: no weight_map")
        have = {n for f in files for n in f.tensors}
        missing = sorted(set(weight_map) - have)
        if missing:
            raise ConvertError(f"{index}: tensors listed but in no part: {', '.join(missing[:5])}")
    return files


@dataclass
class Vocab:
    tokens: list[str]
    types: list[int]
    lowercase: bool  # what the tokenizer does to text (for the pre-tokenizer check)
    unk: int  # the tokenizer's own [UNK], [CLS] and [SEP] ids (what it encodes with)
    cls: int
    sep: int


def load_vocab(folder: Path, vocab_size: int | None) -> Vocab:
    """get_vocab_base's tokens and types: ids without a token as [PADi] UNUSED; added tokens CONTROL
    when special, USER_DEFINED otherwise; the rest NORMAL."""
    tok_json = folder / "tokenizer.json"
    tok_cfg = read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    vocab: dict[str, int]
    added: dict[int, tuple[str, bool]] = {}
    if tok_json.is_file():
        tj = read_json(tok_json)
        model = tj.get("model") or {}
        if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
            raise ConvertError(f"{tok_json}: model type {model.get('type')!r} is not WordPiece")
        vocab = dict(model["vocab"])
        for a in tj.get("added_tokens") or []:
            added[int(a["id"])] = (str(a["content"]), bool(a.get("special")))
            vocab[str(a["content"])] = int(a["id"])
        norm = tj.get("normalizer") or {}
        lowercase = bool(norm.get("lowercase", False)) if norm.get("type") == "BertNormalizer" else \
            norm.get("type") == "Lowercase"
    elif (folder / "vocab.txt").is_file():
        lines = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        vocab = {}
        for i, t in enumerate(lines):
            vocab.setdefault(t.rstrip("\r"), i)
        # a slow BertTokenizer: its special tokens (the defaults unless tokenizer_config names others)
        for typ in ("unk", "sep", "pad", "cls", "mask"):
            name = _content(tok_cfg.get(f"{typ}_token")) or f"[{typ.upper()}]"
            if name in vocab:
                added[vocab[name]] = (name, True)
        lowercase = bool(tok_cfg.get("do_lower_case", True))
    else:
        raise FileNotFoundError(f"{folder}: no tokenizer.json or vocab.txt")
    if not vocab:
        raise ConvertError(f"{folder}: the vocabulary is empty")
    n = vocab_size if vocab_size is not None else len(vocab)
    if max(vocab.values()) >= n or min(vocab.values()) < 0:
        raise ConvertError(f"{folder}: token ids run to {max(vocab.values())}, outside vocab_size {n}")
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(n):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            special = added[i][1]
            tokens.append(by_id[i] if special else by_id[i].replace("\u2581", " "))
            types.append(CONTROL if special or _looks_special(by_id[i]) else USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(NORMAL)
    ids = []
    for typ in ("unk", "cls", "sep"):
        name = _content(tok_cfg.get(f"{typ}_token")) or f"[{typ.upper()}]"
        if name not in vocab:
            raise ConvertError(f"{folder}: the tokenizer's {typ} token {name!r} is not in its vocabulary")
        ids.append(vocab[name])
    return Vocab(tokens, types, lowercase, *ids)


def _looks_special(t: str) -> bool:
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<｜") and t.endswith("｜>")) or (t.startswith("<unused") and t.endswith(">")))


def _content(entry: Any) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return str(entry["content"])
    return None


@dataclass
class SpecialVocab:
    """gguf-py's SpecialVocab for a WordPiece tokenizer: special token ids, add_*_token flags and the
    normalizer flags, each dict in the order its keys are written."""
    ids: dict[str, int] = field(default_factory=dict)
    add: dict[str, bool] = field(default_factory=dict)
    lowercase: bool | None = None
    strip_accents: bool | None = None


def load_special_vocab(folder: Path, n_vocab: int) -> SpecialVocab:
    sv = SpecialVocab()
    types = list(SPECIAL_TYPES)
    tj = read_json(folder / "tokenizer.json") if (folder / "tokenizer.json").is_file() else None
    cfg = read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else None
    added_tokens: list[dict[str, Any]] = []
    if isinstance(tj, dict):
        _normalizer(sv, tj.get("normalizer") or {})
        added_tokens = list(tj.get("added_tokens") or [])
        _post_processor(sv, tj.get("post_processor") or {}, cfg, types)
    if isinstance(cfg, dict) and cfg:
        for typ in types:
            flag = cfg.get(f"add_{typ}_token")
            if isinstance(flag, bool) and typ not in sv.add:
                sv.add[typ] = flag
            content = _content(cfg.get(f"{typ}_token"))
            if content is not None:
                tid = next((a.get("id") for a in added_tokens if a.get("content") == content), None)
                _set_special(sv, typ, tid, n_vocab)
    config = read_json(folder / "config.json")
    for typ in types:
        _set_special(sv, typ, config.get(f"{typ}_token_id"), n_vocab)
    return sv


def _set_special(sv: SpecialVocab, typ: str, tid: Any, n_vocab: int) -> None:
    if not isinstance(tid, int) or isinstance(tid, bool):
        return
    if tid < 0:
        raise ConvertError(f"invalid id for the {typ} token: {tid}")
    if tid < n_vocab and typ not in sv.ids:
        sv.ids[typ] = tid


def _normalizer(sv: SpecialVocab, norm: dict[str, Any]) -> None:
    kind = norm.get("type")
    if kind == "Lowercase":
        sv.lowercase = True
    elif kind == "StripAccents":
        sv.strip_accents = True
    elif kind == "BertNormalizer":
        if "lowercase" in norm:
            sv.lowercase = norm["lowercase"]
        if "strip_accents" in norm:
            sv.strip_accents = norm["strip_accents"]
    elif kind == "Sequence":
        for n in norm.get("normalizers", []):
            _normalizer(sv, n)


def _special_id(piece: dict[str, Any]) -> str | None:
    v = piece.get("SpecialToken", {}).get("id")
    return v if isinstance(v, str) and v else None


def _post_processor(sv: SpecialVocab, post: dict[str, Any], cfg: dict[str, Any] | None, types: list[str]) -> None:
    """Whether [CLS]/[SEP] (bos/eos/sep) are added, read from the tokenizer's post-processor the way
    gguf-py reads it (simple templates only); cfg gains the bos/eos/cls/sep names it implies."""
    c = cfg if cfg else None
    bos, cls = (c or {}).get("bos_token"), (c or {}).get("cls_token")
    eos, sep = (c or {}).get("eos_token"), (c or {}).get("sep_token")
    if not bos and cls and c:
        c["bos_token"] = bos = cls
    if not eos and sep and c:
        c["eos_token"] = eos = sep
    for proc in post.get("processors", [post]) if post else []:
        kind = proc.get("type")
        if kind == "ByteLevel":
            sv.add.setdefault("bos", False)
            sv.add.setdefault("eos", False)
        elif kind == "RobertaProcessing":
            sv.add.update(bos=True, eos=True, sep=True)
            if not cls and c:
                c["cls_token"] = cls = proc.get("cls", [bos])[0]
            if not sep and c:
                c["sep_token"] = sep = proc.get("sep", [eos])[0]
        elif kind == "TemplateProcessing":
            single, pair = proc.get("single", []), proc.get("pair", [])
            first = last = None
            if len(single) > 1:
                if first := _special_id(single[0]):
                    if not c:
                        bos = first
                    elif first not in (bos, cls):
                        if not bos:
                            c["bos_token"] = bos = first
                        if not cls:
                            c["cls_token"] = cls = first
                    sv.add["bos"] = first in (bos, cls)
                if last := _special_id(single[-1]):
                    if not c:
                        eos = last
                    elif last != eos:
                        for extra in ("eot", "eom"):
                            if extra not in types:
                                types.append(extra)
                                c[f"{extra}_token"] = eos
                                break
                        c["eos_token"] = eos = last
                    sv.add["eos"] = last == eos
            if pair:
                lo = 1 if first and _special_id(pair[0]) == first else 0
                hi = -1 if last and _special_id(pair[-1]) == last else None
                inner = pair[lo:hi]
                if inner and inner[0].get("Sequence", {}).get("id") == "A" \
                        and inner[-1].get("Sequence", {}).get("id") == "B" and (mid := inner[1:-1]):
                    add_sep = False
                    if (tok := _special_id(mid[0])) and tok in (sep, eos) and not last:
                        add_sep = True
                    if len(mid) == 2 and (tok := _special_id(mid[1])) and tok in (sep, eos):
                        add_sep = True
                    sv.add["sep"] = add_sep
                    if add_sep and not sep and c:
                        c["sep_token"] = eos


def pooling_type(folder: Path, config: dict[str, Any]) -> int | None:
    """sentence-transformers' pooling (modules.json -> its Pooling module's config.json), else None."""
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return None
    modules = read_json(modules_path)
    path = next((m.get("path") for m in modules if isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling")),
                None) if isinstance(modules, list) else None
    if path is None:
        return None
    pooling = read_json(folder / path / "config.json")
    modes = {"mean": POOLING["mean"], "cls": POOLING["cls"], "lasttoken": POOLING["last"]}
    if pooling.get("pooling_mode_mean_tokens"):
        return POOLING["mean"]
    if pooling.get("pooling_mode_cls_token"):
        return POOLING["cls"]
    if pooling.get("pooling_mode_lasttoken"):
        return POOLING["last"]
    if pooling.get("pooling_mode") in modes:
        return modes[pooling["pooling_mode"]]
    raise ConvertError(f"{folder / path / 'config.json'}: only mean, cls and last-token pooling are supported")
