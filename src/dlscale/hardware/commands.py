"""The `dlscale catalog` and `dlscale devices` verbs; cli.py only parses."""

from __future__ import annotations

import argparse
import json

from dlscale.hardware.catalog import load_catalog
from dlscale.hardware.detect import detect
from dlscale.hardware.report import catalog_table, device_text, host_text


def catalog(args: argparse.Namespace) -> int:
    """`dlscale catalog [NAME]`: the accelerator catalog, or one entry, as text or JSON."""
    entries = load_catalog()
    if args.name:
        spec = entries.get(args.name)
        print(json.dumps(spec.to_dict(), indent=2) if args.json else device_text(spec))
    elif args.json:
        print(json.dumps([spec.to_dict() for spec in entries], indent=2))
    else:
        print(catalog_table(entries))
    return 0


def devices(args: argparse.Namespace) -> int:
    """`dlscale devices`: this host's CPU and GPUs (NVML), MIG instances included."""
    host = detect()
    print(json.dumps(host.to_dict(), indent=2) if args.json else host_text(host))
    return 0


def local_device() -> str:
    """This host's first GPU that the catalog knows, else the CPU entry."""
    return next((g.catalog for g in detect().gpus if g.catalog), "CPU")
