"""`dlscale serve`: its flags are generated from dlscale.server_settings' fields (and --ray's)."""

from __future__ import annotations

import argparse

from dlscale.cli_verbs import LazyHandler, SubParsers


def add_verbs(sub: SubParsers) -> None:
    """`dlscale serve`: its flags are generated from dlscale.server_settings' fields."""
    from dlscale.scale.settings import add_ray_flags
    from dlscale.server_settings.flags import add_serve_flags

    serve = sub.add_parser("serve", help="serve a repository over the Open Inference Protocol")
    add_serve_flags(
        serve, {"device_workers": LazyHandler("dlscale.cli_verbs.serve", "serve_on_devices")}
    )
    serve.set_defaults(func=LazyHandler("dlscale.server", "serve"))
    add_ray_flags(serve, LazyHandler("dlscale.scale.commands", "serve_on_ray"))


def serve_on_devices(args: argparse.Namespace) -> int:
    """`dlscale serve REPO --device-workers SPEC` (docs/scale.md): the host's devices are
    detected here, since scale does not read the hardware itself (DESIGN.md's layers)."""
    from dlscale.hardware.detect import detect
    from dlscale.scale.local_fleet import serve_on_devices as serve_fleet

    return serve_fleet(args, detect)
