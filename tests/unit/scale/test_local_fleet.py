"""The device workers' rules without starting one: refused flags, a worker's settings, the
merged metrics view."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from dlscale.cli import main, parse
from dlscale.cli_verbs import LazyHandler
from dlscale.errors import ConfigError
from dlscale.scale.devices import Device
from dlscale.scale.local_fleet import merged, worker_settings
from dlscale.server import ServerSettings, settings_from
from dlscale.serving.metrics.exposition import render


def test_the_flag_runs_the_fleet_and_the_others_the_server(tmp_path: Path) -> None:
    fleet = parse(["serve", str(tmp_path), "--device-workers", "auto"])
    assert fleet.func.handler == LazyHandler("dlscale.cli_verbs.serve", "serve_on_devices")
    assert settings_from(fleet).network.device_workers == "auto"
    assert parse(["serve", str(tmp_path)]).func.handler == LazyHandler("dlscale.server", "serve")
    with pytest.raises(ConfigError, match="auto, a count, or a list"):
        settings_from(parse(["serve", str(tmp_path), "--device-workers", " "]))


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (
            ["--allow-client-shm"],
            "--allow-client-shm: a client's region is registered with the one",
        ),
        (["--model-control", "explicit"], "a load or unload over the API reaches one worker only"),
        (["--model-control", "on-demand"], "a load or unload over the API reaches one worker"),
        (["--tls-cert", "c.pem", "--tls-key", "k.pem"], "put TLS in front of it"),
        (["--http-port", "-1"], "checks each worker's REST /v2/health/ready"),
    ],
)
def test_flags_that_need_one_process_are_refused(
    flags: list[str], why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["serve", str(tmp_path), "--device-workers", "2", *flags])
    said = capsys.readouterr().err
    assert code == 1 and why in said and "not available with --device-workers" in said, said


@pytest.mark.parametrize(
    "order", [["--ray", "--device-workers", "2"], ["--device-workers", "2", "--ray"]]
)
def test_ray_and_device_workers_together_are_refused_in_either_order(
    order: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray", reason="--ray's handler needs the [ray] extra")
    code = main(["serve", str(tmp_path), *order])
    assert code == 1 and "--device-workers is not for --ray" in capsys.readouterr().err


def test_a_worker_serves_on_loopback_port_0_with_its_own_trace_file(tmp_path: Path) -> None:
    user = ServerSettings.build(
        tmp_path, host="0.0.0.0", http_port=8000, grpc_port=None, metrics_port=9000,
        device_workers="auto", http_workers=2, trace_file=tmp_path / "trace.json",
    )  # fmt: skip
    worker = worker_settings(user, Device("gpu0.mig2", "MIG-x"))
    net = worker.network
    assert (net.host, net.http_port, net.grpc_port, net.metrics_port) == ("127.0.0.1", 0, None, 0)
    assert net.device_workers is None  # a worker is a plain server, never a fleet itself
    assert net.http_workers == 2  # each worker has its own REST processes
    assert worker.observation.trace_file == tmp_path / "trace.gpu0.mig2.json"


def _worker_text(served: float) -> str:
    """A worker's metrics: a Triton counter (no _total), a prometheus_client one, a histogram."""
    registry = CollectorRegistry()
    Counter("dlscale_things", "things", registry=registry).inc(served)
    triton = (
        "# HELP nv_inference_request_success Number of successful inference requests\n"
        "# TYPE nv_inference_request_success counter\n"
        f'nv_inference_request_success{{model="m",version="1"}} {served}\n'
        "# HELP wait_seconds wait\n# TYPE wait_seconds histogram\n"
        'wait_seconds_bucket{le="1.0"} 1.0\nwait_seconds_bucket{le="+Inf"} 1.0\n'
        "wait_seconds_sum 0.5\nwait_seconds_count 1.0\n"
    )
    return triton + render(registry).decode()


def test_the_merged_view_labels_each_worker_and_keeps_the_names() -> None:
    class Families(Collector):
        def collect(self) -> list[Metric]:
            return merged({"gpu0": _worker_text(3), "gpu1": _worker_text(5)})

    text = render(Families()).decode()
    lines = text.splitlines()
    assert lines.count("# TYPE nv_inference_request_success counter") == 1
    assert 'nv_inference_request_success{device="gpu0",model="m",version="1"} 3.0' in lines
    assert 'nv_inference_request_success{device="gpu1",model="m",version="1"} 5.0' in lines
    assert lines.count("# TYPE dlscale_things_total counter") == 1
    assert 'dlscale_things_total{device="gpu1"} 5.0' in lines
    assert 'wait_seconds_bucket{device="gpu0",le="+Inf"} 1.0' in lines
    assert 'wait_seconds_count{device="gpu1"} 1.0' in lines
