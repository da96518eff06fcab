"""The general.* keys llama.cpp's converter derives from a Hugging Face folder (gguf-py's Metadata):
name, organization, basename, size label, license, tags, languages, base models and datasets, from the
README.md model card's YAML front matter, config.json's _name_or_path and the folder's name.

The front matter is read by a small parser of the block YAML model cards use (scalars, lists of
scalars, flow lists); a key in any other form is left out, so the output never depends on PyYAML.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_VERSION = re.compile(r"(v|iter)?\d+([.]\d+)*", re.IGNORECASE)
_QUANT = re.compile(r"i?q\d(_\w)*|b?fp?(16|32)", re.IGNORECASE)
_SIZE = re.compile(r"(([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl)", re.IGNORECASE)
_FINETUNE = re.compile(r"chat|instruct|vision|lora", re.IGNORECASE)
_HF_URL = re.compile(r"https?://huggingface.co/([^/]+/[^/]+)$")
_ENTRY_KEYS = ("name", "author", "version", "organization", "description", "url", "doi", "uuid", "repo_url")


def _scalar(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    if text in ("", "~", "null", "Null", "NULL"):
        return None
    if text.startswith(("{", "&", "*", "!", "|", ">")):
        raise ValueError(text)  # a mapping, anchor, tag or block scalar: not read
    if text.startswith("["):
        if not text.endswith("]"):
            raise ValueError(text)
        return [_scalar(t) for t in text[1:-1].split(",") if t.strip()]
    return text


def front_matter(readme: Path) -> dict[str, Any]:
    """The top-level keys of README.md's front matter (between the first two `---` lines)."""
    try:
        lines = readme.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    if not lines or lines[0] != "---":
        return {}
    out: dict[str, Any] = {}
    key: str | None = None
    for line in lines[1:]:
        if line == "---":
            break
        line = line.replace("\t", "  ")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] not in " -" and ":" in line:
            key, _, rest = line.partition(":")
            key = key.strip()
            try:
                out[key] = _scalar(rest) if rest.strip() else None
            except ValueError:
                out.pop(key, None)
                key = None
        elif key is not None and line.lstrip().startswith("- "):
            if out.get(key) is None:
                out[key] = []
            try:
                item = _scalar(line.lstrip()[2:])
            except ValueError:
                out.pop(key, None)
                key = None
                continue
            if isinstance(out[key], list):
                out[key].append(item)
        elif key is not None:
            out.pop(key, None)  # a nested mapping or a continued scalar: not read
            key = None
    return out


def id_to_title(s: str) -> str:
    return " ".join(w.title() if w.islower() and not re.match(r"^(v\d+(?:\.\d+)*|\d.*)$", w) else w
                    for w in s.strip().replace("-", " ").split())


@dataclass
class IdParts:
    name: str | None = None
    org: str | None = None
    basename: str | None = None
    finetune: str | None = None
    version: str | None = None
    size_label: str | None = None


def _size_part(part: str, total_params: int, kinds: set[str]) -> str:
    part = part.replace("_", ".")
    if part[-1].isdecimal():  # bloom-7b1 -> 7.1B
        part = part[:-2] + "." + part[-1] + part[-2]
    if len(part) > 1 and part[-2].isdecimal() and part[-1] in "kmbt":
        part = part[:-1] + part[-1].upper()
    if total_params != 0:
        try:
            label = float(part[:-1]) * pow(1000, " KMBT".find(part[-1]))
            if (total_params < 0 and label < abs(total_params) // 8) or (
                    total_params > 0 and abs(label - total_params) > 7 * total_params // 8):
                kinds.add("finetune")  # far from the model's size: a context length, say
                part = part[:-1] + part[-1].lower()
        except ValueError:
            pass
    if not kinds:
        kinds.add("size_label")
    return part


def id_parts(model_id: str | None, total_params: int = 0) -> IdParts:
    """A Hugging Face id `org/name-size-finetune-version` taken apart as gguf-py's heuristics do."""
    if model_id is None:
        return IdParts()
    if " " in model_id:
        return IdParts(name=model_id)
    org_c: str | None
    org_c, full = model_id.split("/", 1) if "/" in model_id else (None, model_id)
    if org_c is not None and org_c.startswith("."):  # ./ or ../: a path, not an organization
        org_c = None
    parts = [p for p in full.split("-") if p]
    kinds: list[set[str]] = [set() for _ in parts]
    for i, part in enumerate(parts):
        if _VERSION.fullmatch(part):
            kinds[i].add("version")
        elif _QUANT.fullmatch(part):
            kinds[i].add("type")
            parts[i] = part.upper()
        elif i > 0 and _SIZE.fullmatch(part):
            parts[i] = _size_part(part, total_params, kinds[i])
        elif i > 0 and _FINETUNE.fullmatch(part):
            kinds[i].add("type" if total_params < 0 and part.lower() == "lora" else "finetune")
    if any(c.isdecimal() for p, k in zip(parts, kinds) if "size_label" in k for c in p):
        for p, k in zip(parts, kinds):  # a number-based size label wins over word-based ones
            if "size_label" in k and p.isalpha():
                k.remove("size_label")
    at_start = True
    for p, k in zip(parts, kinds):
        if at_start and ((not k and p[0].isalpha()) or "version" in k):
            k.add("basename")
        else:
            at_start = False
            if not k:
                k.add("finetune")
    for k in reversed(kinds):  # a trailing version is no part of the basename
        if "basename" in k and len(k) > 1:
            k.remove("basename")
        else:
            break
    basename = "-".join(p for p, k in zip(parts, kinds) if "basename" in k) or None
    size = "-".join(dict.fromkeys(p for p, k in zip(parts, kinds) if "size_label" in k)) or None
    finetune = "-".join(p for p, k in zip(parts, kinds) if "finetune" in k) or None
    version = "-".join(p for p, k in zip(parts, kinds) if "version" in k and "basename" not in k) or None
    if size is None and finetune is None and version is None:
        basename = None  # too ambiguous
    return IdParts(full, org_c, basename, finetune, version, size)


def _entry(ref: Any, total_params: int) -> dict[str, Any]:
    """A base model or dataset of the model card: a URL, a Hugging Face id, or a map given as is."""
    if isinstance(ref, dict):
        return ref
    if not isinstance(ref, str):
        return {}
    out: dict[str, Any] = {}
    url = ref.startswith(("http://", "https://", "ssh://"))
    hf_id = ref
    if url:
        out["repo_url"] = ref
        m = _HF_URL.match(ref) if "huggingface.co" in ref else None
        if m is None:
            return out
        hf_id = m.group(1)
    p = id_parts(hf_id, total_params)
    if p.name is not None:
        out["name"] = id_to_title(p.name)
    if p.org is not None:
        out["organization"] = id_to_title(p.org)
    if p.version is not None:
        out["version"] = p.version
    if not url and p.org is not None and p.name is not None:
        out["repo_url"] = f"https://huggingface.co/{p.org}/{p.name}"
    return out


def _as_list(v: Any) -> list[Any]:
    return [v] if isinstance(v, str) else list(v) if isinstance(v, list) else []


@dataclass
class ModelCard:
    """What set_gguf_meta_model writes, field by field (None: not written)."""
    name: str | None = None
    author: str | None = None
    version: str | None = None
    organization: str | None = None
    finetune: str | None = None
    basename: str | None = None
    description: str | None = None
    size_label: str | None = None
    license: Any = None
    license_name: str | None = None
    license_link: str | None = None
    source_url: str | None = None
    source_doi: str | None = None
    source_uuid: str | None = None
    source_repo_url: str | None = None
    base_models: list[dict[str, Any]] | None = None
    datasets: list[dict[str, Any]] | None = None
    tags: list[Any] | None = None
    languages: list[Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def _first(self, attr: str, card: dict[str, Any], *keys: str) -> None:
        for k in keys:
            if k in card and getattr(self, attr) is None:
                setattr(self, attr, card[k])

    def _from_id(self, p: IdParts) -> None:
        for attr, v in (("name", id_to_title(p.name) if p.name else None),
                        ("organization", id_to_title(p.org) if p.org else None), ("basename", p.basename),
                        ("finetune", p.finetune), ("version", p.version), ("size_label", p.size_label)):
            if getattr(self, attr) is None and v is not None:
                setattr(self, attr, v)


def read_model_card(folder: Path, total_params: int) -> ModelCard:
    card = front_matter(folder / "README.md")
    mc = ModelCard()
    for attr, keys in (("name", ("name", "model_name")), ("author", ("author", "model_author", "model_creator")),
                       ("version", ("version", "model_version")),
                       ("organization", ("organization", "model_organization")),
                       ("description", ("description", "model_description")),
                       ("finetune", ("finetune", "model_finetune")),
                       ("basename", ("basename", "model_basename", "model_type")),
                       ("size_label", ("size_label", "model_size_label")),
                       ("source_url", ("url", "model_url")), ("source_doi", ("doi", "model_doi")),
                       ("source_uuid", ("uuid", "model_uuid")), ("source_repo_url", ("repo_url", "model_repo_url"))):
        mc._first(attr, card, *keys)
    for attr, keys in (("base_models", ("base_model", "base_models", "base_model_sources")),
                       ("datasets", ("datasets", "dataset", "dataset_sources"))):
        present = [k for k in keys if k in card]
        if present:
            setattr(mc, attr, [_entry(r, total_params) for r in _as_list(card[present[0]])])
    mc._first("license", card, "license")
    mc._first("license_name", card, "license_name")
    mc._first("license_link", card, "license_link")
    for attr, keys in (("tags", ("tags", "pipeline_tag")), ("languages", ("languages", "language"))):
        for k in keys:
            if card.get(k) is not None:
                setattr(mc, attr, (getattr(mc, attr) or []) + _as_list(card[k]))
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    hf_id = config.get("_name_or_path") if isinstance(config, dict) else None
    if isinstance(hf_id, str) and hf_id.count("/") <= 1:  # an id, not a path on someone's disk
        mc._from_id(id_parts(hf_id, total_params))
    mc._from_id(id_parts(folder.resolve().name, total_params))
    return mc


def size_label(total_params: int) -> str:
    """gguf-py's model_weight_count_rounded_notation with two significant digits at least."""
    n = abs(total_params)
    scaled, suffix = ((n * 1e-12, "T") if n > 1e12 else (n * 1e-9, "B") if n > 1e9
                      else (n * 1e-6, "M") if n > 1e6 else (n * 1e-3, "K"))
    fix = max(2 - len(str(round(scaled)).lstrip("0")), 0)
    return f"{scaled:.{fix}f}{suffix}"


def general_keys(mc: ModelCard) -> list[tuple[str, Any]]:
    """(key, value) in set_gguf_meta_model's order; strings, except the counts (uint32) and lists."""
    out: list[tuple[str, Any]] = [("general.name", mc.name)]
    for key, v in (("author", mc.author), ("version", mc.version), ("organization", mc.organization),
                   ("finetune", mc.finetune), ("basename", mc.basename), ("description", mc.description),
                   ("size_label", mc.size_label),
                   ("license", ",".join(mc.license) if isinstance(mc.license, list) else mc.license),
                   ("license.name", mc.license_name), ("license.link", mc.license_link),
                   ("source.url", mc.source_url), ("source.doi", mc.source_doi), ("source.uuid", mc.source_uuid),
                   ("source.repo_url", mc.source_repo_url)):
        if v is not None:
            out.append((f"general.{key}", v))
    for group, entries in (("base_model", mc.base_models), ("dataset", mc.datasets)):
        if entries is not None:
            out.append((f"general.{group}.count", len(entries)))
            for i, e in enumerate(entries):
                out += [(f"general.{group}.{i}.{k}", e[k]) for k in _ENTRY_KEYS if k in e]
    if mc.tags is not None:
        out.append(("general.tags", mc.tags))
    if mc.languages is not None:
        out.append(("general.languages", mc.languages))
    return out
