"""`dlscale serve`'s flags, generated from the settings' fields and read back into them."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlscale.errors import ConfigError
from dlscale.frontends.limits import Limits
from dlscale.server_settings import GROUPS, ServerSettings
from dlscale.server_settings.triton import add_triton_flags


def _flagged(kind: type[Any]) -> Iterator[dataclasses.Field[Any]]:
    return (f for f in dataclasses.fields(kind) if f.metadata.get("flags"))


def add_serve_flags(serve: argparse.ArgumentParser) -> None:
    """`dlscale serve`'s flags, generated from the groups' fields; Triton's spellings beside."""
    serve.add_argument("repo", type=Path, nargs="?", help="model repository")
    serve.add_argument(
        "--model-repository",
        "--model-store",
        type=Path,
        metavar="REPO",
        help="the model repository, as Triton takes it (instead of REPO)",
    )
    for kind, title in GROUPS.values():
        group = serve.add_argument_group(title)
        if kind is Limits:
            _add_limit_flags(group)
            continue
        for item in _flagged(kind):
            arg = dict(item.metadata["arg"])
            default: Any = item.default
            if arg.get("action") == "append":  # argparse appends to a copy of a list
                default = list(default)
            shown = str(default).lower() if isinstance(default, bool) else default
            text = item.metadata["help"]
            if default not in (None, [], "") and "default" not in text:
                text = f"{text} (default {shown})"
            flags = item.metadata["flags"]
            if arg.get("action", "append") == "append" and not {"choices", "metavar"} & arg.keys():
                # named as the flag, not as the field
                arg["metavar"] = flags[0][2:].upper().replace("-", "_")
            group.add_argument(*flags, dest=item.name, default=default, help=text, **arg)
    add_triton_flags(serve)


def _add_limit_flags(group: argparse._ArgumentGroup) -> None:
    """One flag per limit, each described once, in dlscale.frontends.limits.Limits."""
    defaults = Limits()
    for dest, (name, text) in _MIB_FLAGS.items():
        mib = getattr(defaults, name) / 2**20
        group.add_argument(
            "--" + dest.replace("_", "-"), type=float, default=mib, help=f"{text} (default {mib:g})"
        )
    for item in dataclasses.fields(Limits):
        if item.name in (name for name, _ in _MIB_FLAGS.values()):
            continue  # set in MiB by the two flags above
        group.add_argument(
            "--" + item.name.replace("_", "-"),
            type=type(item.default),
            default=None,
            metavar="N",
            help=f"{item.metadata['help']} (default {item.default:,})",
        )


#: The Limits set in MiB: the flag's dest -> (the Limits field, the flag's help).
_MIB_FLAGS = {
    "max_body_mb": ("max_body_bytes", "REST body size limit in MiB"),
    "max_grpc_mb": ("max_grpc_message_bytes", "gRPC message size limit in MiB"),
}


def settings_from(args: argparse.Namespace) -> ServerSettings:
    """ServerSettings from `dlscale serve`'s flags; a bad flag value is a ConfigError."""
    groups: dict[str, Any] = {}
    try:
        for name, (kind, _) in GROUPS.items():
            groups[name] = _limits_from(args) if kind is Limits else _group_from(kind, args)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return ServerSettings(repository_from(args), **groups)


def _group_from(kind: type[Any], args: argparse.Namespace) -> Any:
    values = {}
    for item in _flagged(kind):
        value = getattr(args, item.name, item.default)
        convert = item.metadata["convert"]
        values[item.name] = convert(value) if convert is not None else value
    return kind(**values)


def _limits_from(args: argparse.Namespace) -> Limits:
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(Limits)
        if getattr(args, f.name, None) is not None
    }
    for dest, (name, _) in _MIB_FLAGS.items():
        if getattr(args, dest, None) is not None:
            given[name] = int(getattr(args, dest) * 2**20)
    return Limits(**given)


#: Files that make a folder a model (its configuration), not a repository.
MODEL_FILES = ("config.toml", "config.pbtxt", "model-settings.json")


def repository_from(args: argparse.Namespace) -> Path:
    """The repository: REPO or Triton's --model-repository; a model folder is refused."""
    given = [p for p in (args.repo, getattr(args, "model_repository", None)) if p is not None]
    if not given:
        raise ConfigError("which model repository? dlscale serve REPO (or --model-repository)")
    if len(given) == 2 and given[0] != given[1]:
        raise ConfigError(f"two repositories: REPO {given[0]} and --model-repository {given[1]}")
    path = Path(given[0])
    versions = path.is_dir() and any(c.name.isdigit() and c.is_dir() for c in path.iterdir())
    configs = [name for name in MODEL_FILES if (path / name).is_file()]
    if versions or configs:
        held = ", ".join([*(["version folders"] if versions else []), *configs])
        raise ConfigError(
            f"{path} is a model folder (it holds {held}), not a repository; serve its parent "
            f"({path.resolve().parent})"
        )
    return path
