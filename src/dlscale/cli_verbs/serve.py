"""`dlscale serve`: its flags are generated from dlscale.server_settings' fields (and --ray's)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from dlscale.cli_verbs import Handler, LazyHandler, SubParsers
from dlscale.errors import ConfigError


def add_verbs(sub: SubParsers) -> None:
    """`dlscale serve`: its flags are generated from dlscale.server_settings' fields."""
    from dlscale.scale.settings import add_ray_flags
    from dlscale.server_settings.flags import add_serve_flags

    serve = sub.add_parser("serve", help="serve a repository over the Open Inference Protocol")
    on_devices = WithoutRay(LazyHandler("dlscale.cli_verbs.serve", "serve_on_devices"))
    add_serve_flags(serve, {"device_workers": on_devices})
    on_host = WithoutRay(LazyHandler("dlscale.server", "serve"))
    serve.set_defaults(func=on_host)
    ray_flags = add_ray_flags(serve, LazyHandler("dlscale.scale.commands", "serve_on_ray"))
    on_devices.ray_flags.extend(ray_flags)
    on_host.ray_flags.extend(ray_flags)


@dataclass(frozen=True)
class WithoutRay:
    """A handler of `dlscale serve` without --ray, which refuses the flags only --ray reads:
    ignored, `--replicas 4` would give one server and no word of it."""

    handler: Handler
    ray_flags: list[argparse.Action] = field(default_factory=list)

    def __call__(self, args: argparse.Namespace) -> int:
        given = [a.option_strings[0] for a in self.ray_flags if getattr(args, a.dest) != a.default]
        if given and not getattr(args, "ray", False):  # with --ray, its handler answers
            raise ConfigError(
                f"{', '.join(given)}: set how --ray serves (replicas on a Ray cluster), and "
                "--ray was not given: add it, or drop them"
            )
        return self.handler(args)


def serve_on_devices(args: argparse.Namespace) -> int:
    """`dlscale serve REPO --device-workers SPEC` (docs/scale.md): the host's devices are
    detected here, since scale does not read the hardware itself (DESIGN.md's layers)."""
    from dlscale.hardware.detect import detect
    from dlscale.scale.local_fleet import serve_on_devices as serve_fleet

    return serve_fleet(args, detect)
