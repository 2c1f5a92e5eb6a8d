"""The tenants of an interference bench: their repository with [qos] set, and MIG placement.

The bench never edits the user's repository: it writes a scratch one beside its report whose
config.toml files are the user's with the [qos] (and, on MIG, the device) the run needs, and
whose version folders link to the user's.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import httpx

from dlscale.errors import BenchError, DlscaleError
from dlscale.hardware.detect import HostInfo, MigInstance
from dlscale.models.config import InstanceConfig, ModelConfig, write_config
from dlscale.models.config_sections import QosConfig
from dlscale.models.repository import ModelRepository
from dlscale.native import end_child

#: What `dlscale serve` logs once a frontend listens (server.py).
_LISTENING = re.compile(r"(http|grpc) listening on ([\w.:-]+):(\d+)")


@dataclass(frozen=True)
class TenantSpec:
    """One model of the run: its name, the [qos] to serve it with, and its device if fixed."""

    model: str
    qos: QosConfig
    device: str | None = None


def scratch_repository(source: Path, tenants: list[TenantSpec], root: Path) -> Path:
    """A repository at `root` holding `tenants` as `source` has them, with their [qos] set."""
    try:
        repo = ModelRepository(source)
        for tenant in tenants:
            config = repo.config(tenant.model)
            changes: dict[str, object] = {"qos": tenant.qos}
            if tenant.device is not None:
                changes["instances"] = [InstanceConfig(device=tenant.device)]
            copy_model(
                source / tenant.model, config.model_copy(update=changes), root / tenant.model
            )
    except DlscaleError as exc:
        raise BenchError(f"cannot prepare the tenants: {exc}") from None
    return root


def copy_model(source: Path, config: ModelConfig, folder: Path) -> None:
    """A model folder holding `config` and links to the version folders of `source`."""
    folder.mkdir(parents=True, exist_ok=True)
    write_config(config, folder / "config.toml")
    for version in source.iterdir():
        link = folder / version.name
        if version.is_dir() and version.name.isdigit() and not link.exists():
            link.symlink_to(version.resolve(), target_is_directory=True)


def configured_qos(source: Path, model: str) -> QosConfig | None:
    """The [qos] table a model of `source` has, if any."""
    try:
        return ModelRepository(source).config(model).qos
    except DlscaleError as exc:
        raise BenchError(str(exc)) from None


def mig_pair(host: HostInfo) -> tuple[MigInstance, MigInstance] | None:
    """Two MIG instances for two tenants, on one GPU where one has two; None without."""
    per_gpu = [g.mig_instances for g in host.gpus if g.mig_enabled]
    for instances in per_gpu:
        if len(instances) >= 2:
            return instances[0], instances[1]
    every = [m for instances in per_gpu for m in instances]
    return (every[0], every[1]) if len(every) >= 2 else None


class TenantServer:
    """`dlscale serve` over one tenant's repository, in a process of its own.

    CUDA enumerates one MIG instance per process, so a tenant on a MIG instance is served by a
    process that sees only that one (CUDA_VISIBLE_DEVICES). The REST port is the OS's choice,
    read from the server's log; `flags` go after the command's own (argparse keeps the last).
    """

    def __init__(
        self,
        repo: Path,
        visible: str | None,
        log: Path,
        timeout_s: float = 300,
        flags: Sequence[str] = (),
    ) -> None:
        self.repo = repo
        self.visible = visible
        self.log = log
        self.timeout_s = timeout_s
        self.flags = list(flags)
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The command line the server runs."""
        return [
            sys.executable, "-m", "dlscale", "serve", str(self.repo),
            "--http-port", "0", "--grpc-port", "-1", "--metrics-port", "-1", *self.flags,
        ]  # fmt: skip

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with the tenant's device the only one CUDA shows."""
        env = dict(base)
        if self.visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible
        return env

    def addresses(self) -> dict[str, str]:
        """{protocol: HOST:PORT} of each frontend the server's log says listens."""
        text = self.log.read_text(errors="replace")
        return {m[1]: f"{m[2]}:{m[3]}" for m in _LISTENING.finditer(text)}

    def wait_ready(self, timeout_s: float = 600) -> None:
        """Return once the server is ready (its start's models loaded); BenchError with the end
        of its log as soon as it exits or a model fails to load."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            if self._process is None or self._process.poll() is not None or ": UNAVAILABLE" in text:
                raise BenchError(f"the server over {self.repo} failed: {text[-800:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v2/health/ready", timeout=10).status_code == 200:
                    return
            time.sleep(0.1)
        raise BenchError(f"the server over {self.repo} was not ready in {timeout_s:g} s")

    def __enter__(self) -> Self:
        with self.log.open("wb") as sink:
            self._process = subprocess.Popen(
                self.command(), stderr=sink, stdout=sink, env=self.environment(dict(os.environ))
            )
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            found = self.addresses().get("http")
            if found:
                self.url = f"http://{found}"
                return self
            if self._process.poll() is not None:
                break
            time.sleep(0.2)
        self.__exit__()
        tail = self.log.read_text(errors="replace")[-800:]
        raise BenchError(f"the server over {self.repo} did not start (log {self.log}): {tail}")

    def __exit__(self, *exc: object) -> None:
        end_child(self._process, 30)
