"""`dlscale serve`: its flags are generated from dlscale.server_settings' fields (and --ray's)."""

from __future__ import annotations

from dlscale.cli_verbs import LazyHandler, SubParsers


def add_verbs(sub: SubParsers) -> None:
    """`dlscale serve`: its flags are generated from dlscale.server_settings' fields."""
    from dlscale.scale.settings import add_ray_flags
    from dlscale.server_settings.flags import add_serve_flags

    serve = sub.add_parser("serve", help="serve a repository over the Open Inference Protocol")
    add_serve_flags(serve)
    serve.set_defaults(func=LazyHandler("dlscale.server", "serve"))
    add_ray_flags(serve, LazyHandler("dlscale.scale.commands", "serve_on_ray"))
