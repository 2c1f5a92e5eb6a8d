"""INT8 against FP32 on this CPU, for BENCHMARKS.md: resnet50 (static QDQ) and bert-base (dynamic).

    python -m benchmarks.optimize_cpu [--repeats 3] [--seconds 5] [--models resnet50,bert-base]

Each variant file is built once with dlscale.optimize's recipes, checked by the accuracy guard
against the FP32 file on the model's validation inputs, then measured `--repeats` times with
MLPerf LoadGen Offline and SingleStream through dlscale's in-process batcher (the same
measurement `dlscale optimize` ranks variants by). Variants alternate within each repeat, so
drift on a shared machine hits them alike; the table gives medians. JSON goes to
bench-results/optimize_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import servers
from dlscale.backends import BackendOptions, create_backend
from dlscale.models.config import load_config
from dlscale.models.zoo import build_zoo
from dlscale.optimize.accuracy import Metric, compare, run_outputs
from dlscale.optimize.measure import MeterSettings, measure
from dlscale.optimize.onnx_variants import build_file
from dlscale.optimize.staging import derived_config, stage
from dlscale.optimize.variants import detect_caps

WORK = servers.WORK / "optimize"
RESULTS = servers.RESULTS
#: (variant name, recipe, recipe parameters) per model.
VARIANTS: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
    "resnet50": [
        ("fp32", "copy", {}),
        ("int8-static-minmax", "int8-static", {"calibration": "MinMax", "per_channel": True}),
        ("int8-static-entropy", "int8-static", {"calibration": "Entropy", "per_channel": True}),
        (
            "int8-static-percentile",
            "int8-static",
            {"calibration": "Percentile", "per_channel": True},
        ),
    ],
    "bert-base": [("fp32", "copy", {}), ("int8-dynamic", "int8-dynamic", {})],
}
METRICS = {"resnet50": [Metric.AGREEMENT, Metric.COSINE], "bert-base": [Metric.COSINE]}


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _outputs(path: Path, validation: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    backend = create_backend("onnxruntime", path, BackendOptions())
    backend.load()
    try:
        return run_outputs(backend, validation, 8)
    finally:
        backend.unload()


def _noise_floor(model_file: Path, validation: dict[str, np.ndarray]) -> float | None:
    """Top-1 agreement of FP32 with itself when the images are rounded to 8-bit pixels."""
    if "input" not in validation or validation["input"].ndim != 4:
        return None
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)
    pixels = np.round((validation["input"] * std + mean) * 255) / 255
    rounded = {"input": ((pixels - mean) / std).astype(np.float32)}
    a = next(iter(_outputs(model_file, validation).values()))
    b = next(iter(_outputs(model_file, rounded).values()))
    return float(np.mean(a.argmax(1) == b.argmax(1)))


def bench_model(name: str, repeats: int, meter: MeterSettings, scratch: Path) -> dict[str, Any]:
    """Build, check and measure one model's variants."""
    folder = WORK / name
    if not (folder / "1" / "model.onnx").is_file():
        build_zoo(WORK, [name])
    config = load_config(folder / "config.toml", name)
    source = folder / "1" / "model.onnx"
    validation = {
        k: v for k, v in _arrays(folder / "1" / "validation.npz").items() if k != "labels"
    }
    calibration = _arrays(folder / "1" / "calibration.npz")
    reference = _outputs(source, validation)
    rows: dict[str, dict[str, Any]] = {}
    repo = scratch / name
    for variant, recipe, params in VARIANTS[name]:
        built = scratch / "build" / name / variant / "model.onnx"
        build_file(recipe, params, source, built, calibration)
        outputs = _outputs(built, validation)
        checks = {m.value: compare(m, reference, outputs, 0.01).to_dict() for m in METRICS[name]}
        label = variant.replace("-", "_")
        stage(repo, label, derived_config(config, label), built, validation)
        rows[variant] = {"accuracy": checks, "runs": []}
        print(f"{name} {variant}: built; {checks}", flush=True)
    for n in range(repeats):
        for variant in rows:
            label = variant.replace("-", "_")
            speed = measure(repo, label, scratch / "logs" / f"{label}-{n}", meter)
            rows[variant]["runs"].append(speed.to_dict())
            print(
                f"{name} {variant} run {n + 1}: {speed.offline_sps:,.2f} samples/s, "
                f"SingleStream p90 {speed.singlestream_p90_ms} ms",
                flush=True,
            )
    base = statistics.median(r["offline_sps"] for r in rows["fp32"]["runs"])
    for row in rows.values():
        row["offline_sps_median"] = statistics.median(r["offline_sps"] for r in row["runs"])
        lat = [r["singlestream_p90_ms"] for r in row["runs"] if r["singlestream_p90_ms"]]
        row["singlestream_p90_ms_median"] = statistics.median(lat) if lat else None
        row["speedup_vs_fp32"] = row["offline_sps_median"] / base if base else None
    return {
        "model": name,
        "validation_rows": len(next(iter(validation.values()))),
        "noise_floor_agreement": _noise_floor(source, validation),
        "variants": rows,
    }


def table(result: dict[str, Any]) -> str:
    """A Markdown table of one model's medians."""
    lines = [
        f"{result['model']} ({result['validation_rows']} validation inputs)",
        "",
        "| variant | Offline samples/s (median) | vs FP32 | SingleStream p90 ms "
        "| accuracy vs FP32 |",
        "|---|---|---|---|---|",
    ]
    for name, row in result["variants"].items():
        acc = "; ".join(f"{m} {c['value']:.4f}" for m, c in row["accuracy"].items())
        lat = row["singlestream_p90_ms_median"]
        lines.append(
            f"| {name} | {row['offline_sps_median']:,.2f} | {row['speedup_vs_fp32']:.2f}x | "
            f"{lat:.1f} | {acc} |"
            if lat
            else f"| {name} | {row['offline_sps_median']:,.2f} | "
            f"{row['speedup_vs_fp32']:.2f}x | - | {acc} |"
        )
    if result["noise_floor_agreement"] is not None:
        lines.append(
            f"\nFP32 against itself with the images rounded to 8-bit pixels: top-1 agreement "
            f"{result['noise_floor_agreement']:.4f}."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--models", default="resnet50,bert-base")
    args = parser.parse_args(argv)
    caps = detect_caps("cpu")
    flags = sorted(caps.cpu_flags & {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8"})
    meter = MeterSettings(seconds=args.seconds, min_queries=32, warmup_s=1.0)
    results = []
    with tempfile.TemporaryDirectory(prefix="optimize-bench-") as tmp:
        for name in args.models.split(","):
            results.append(bench_model(name, args.repeats, meter, Path(tmp)))
    RESULTS.mkdir(exist_ok=True)
    out = {
        "host": {"processor": platform.processor(), "cores": caps.cores, "flags": flags},
        "repeats": args.repeats,
        "seconds": args.seconds,
        "results": results,
    }
    (RESULTS / "optimize_cpu.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nCPU: {caps.cores} cores, flags {flags}\n")
    for result in results:
        print(table(result) + "\n")
    shutil.rmtree(WORK / "logs", ignore_errors=True)


if __name__ == "__main__":
    main()
