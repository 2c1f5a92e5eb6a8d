"""`dlscale serve`'s flags, generated from the settings' fields and read back into them.

Every group's fields say what their flag is in their metadata (server_settings' `setting`, and
frontends/limits.py's fields in the same shape): `help`; `flags` (none: `--NAME` after the
field); `convert`, from the flag's value to the field's; `arg`, argparse's other arguments, with
`default` where the flag's unit is not the field's (MiB); `shown`, the default as -h writes it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dlscale.errors import ConfigError
from dlscale.server_settings import GROUPS, Generative, ServerSettings
from dlscale.server_settings.hf_folder import is_hf_folder, one_model_repository
from dlscale.server_settings.triton import add_triton_flags


def flagged(kind: type[Any]) -> Iterator[dataclasses.Field[Any]]:
    """The fields of `kind` (a settings dataclass) that have a flag."""
    return (f for f in dataclasses.fields(kind) if "flags" in f.metadata)


class Dispatch(argparse.Action):
    """Stores the flag's value (True for a flag that takes none) and makes `handler` the verb's:
    a flag that changes what `dlscale serve` runs (--ray, --device-workers) without the server
    knowing of it."""

    def __init__(self, *args: Any, handler: object, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handler = handler

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
        option_string: str | None = None,
    ) -> None:  # fmt: skip
        setattr(namespace, self.dest, True if self.nargs == 0 else values)
        namespace.func = self.handler


def add_serve_flags(serve: argparse.ArgumentParser, handlers: Mapping[str, object]) -> None:
    """`dlscale serve`'s flags, generated from the groups' fields; Triton's spellings beside.

    `handlers` names, by field, the verb's handler when that field's flag is given."""
    serve.add_argument(
        "repo", type=Path, nargs="?", help="model repository, or a Hugging Face folder"
    )
    serve.add_argument(
        "--model-repository",
        "--model-store",
        type=Path,
        metavar="REPO",
        help="the model repository, as Triton takes it (instead of REPO)",
    )
    # vLLM's older `--model DIR`; named in full, so that it is no longer an ambiguous prefix
    # of --model-repository, --model-control and the others.
    serve.add_argument(
        "--model", type=Path, metavar="DIR", help="REPO, as vLLM takes it (instead of REPO)"
    )
    for kind, title in GROUPS.values():
        group = serve.add_argument_group(title)
        for item in flagged(kind):
            add_flag(group, item, handlers.get(item.name))
    add_triton_flags(serve)


def add_flag(
    group: argparse._ArgumentGroup, item: dataclasses.Field[Any], handler: object | None = None
) -> argparse.Action:
    """The flag of one field, as its metadata says (see the module's docstring)."""
    arg = dict(item.metadata["arg"])
    if handler is not None:
        arg.update(action=Dispatch, handler=handler)
    default: Any = arg.pop("default", item.default)
    if arg.get("action") == "append":  # argparse appends to a copy of a list
        default = list(default)
    shown = str(default).lower() if isinstance(default, bool) else default
    shown = item.metadata.get("shown", shown)
    text = item.metadata["help"]
    if default not in (None, [], "") and "default" not in text:
        text = f"{text} (default {shown})"
    flags = flags_of(item)
    if arg.get("action", "append") == "append" and not {"choices", "metavar"} & arg.keys():
        # named as the flag, not as the field
        arg["metavar"] = flags[0][2:].upper().replace("-", "_")
    return group.add_argument(*flags, dest=item.name, default=default, help=text, **arg)


def flags_of(item: dataclasses.Field[Any]) -> tuple[str, ...]:
    """A field's flags: those its metadata names, else `--` and its name."""
    return tuple(item.metadata["flags"]) or ("--" + item.name.replace("_", "-"),)


def settings_from(args: argparse.Namespace) -> ServerSettings:
    """ServerSettings from `dlscale serve`'s flags; a bad flag value is a ConfigError."""
    groups: dict[str, Any] = {}
    try:
        for name, (kind, _) in GROUPS.items():
            groups[name] = kind(**flag_values(kind, args))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    path = repository_from(args)
    generative: Generative = groups["generative"]
    if is_hf_folder(path):
        return ServerSettings(one_model_repository(path, generative), **groups)
    if generative.given():
        raise ConfigError(
            f"{', '.join(generative.given())}: these set how a Hugging Face folder is served, "
            f"and {path} is a model repository (no config.json): set each model's own in its "
            "config.toml [backend_options] (docs/generative.md)"
        )
    return ServerSettings(path, **groups)


def flag_values(kind: type[Any], args: argparse.Namespace) -> dict[str, Any]:
    """The fields of `kind` that its flags set, read back from parsed flags."""
    values = {}
    for item in flagged(kind):
        if not hasattr(args, item.name):
            continue  # not parsed with these flags: the field's default
        value = getattr(args, item.name)
        convert = item.metadata["convert"]
        try:
            values[item.name] = convert(value) if convert is not None else value
        except ValueError as exc:  # the converter knows the value, not the flag
            raise ValueError(f"{flags_of(item)[0]} {exc}") from None
    return values


#: Files that make a folder a model (its configuration), not a repository.
MODEL_FILES = ("config.toml", "config.pbtxt", "model-settings.json")


def repository_from(args: argparse.Namespace) -> Path:
    """The repository (or Hugging Face folder): REPO, Triton's --model-repository or vLLM's
    --model; a model folder is refused."""
    named = {"REPO": args.repo}
    named["--model-repository"] = getattr(args, "model_repository", None)
    named["--model"] = getattr(args, "model", None)
    given = {flag: Path(p) for flag, p in named.items() if p is not None}
    if not given:
        raise ConfigError("which model repository? dlscale serve REPO (or --model-repository)")
    if len(set(given.values())) > 1:
        raise ConfigError("two repositories: " + " and ".join(f"{f} {p}" for f, p in given.items()))
    path = next(iter(given.values()))
    if is_hf_folder(path):
        return path
    versions = path.is_dir() and any(c.name.isdigit() and c.is_dir() for c in path.iterdir())
    configs = [name for name in MODEL_FILES if (path / name).is_file()]
    if versions or configs:
        held = ", ".join([*(["version folders"] if versions else []), *configs])
        raise ConfigError(
            f"{path} is a model folder (it holds {held}), not a repository; serve its parent "
            f"({path.resolve().parent})"
        )
    return path
