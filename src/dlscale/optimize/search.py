"""The optimizer's driver: try the device's variants, guard accuracy, measure, keep the fastest."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.backends import create_backend
from dlscale.errors import DlscaleError, OptimizeError
from dlscale.models.repository import ModelRepository, ModelVersion
from dlscale.models.runner import load_for_run, options_for
from dlscale.models.signature import reconcile
from dlscale.optimize.accuracy import choose_metric, compare, run_outputs
from dlscale.optimize.data import Arrays, DataSets, load_datasets
from dlscale.optimize.decide import SOURCE_VARIANT, TF_SOURCE_VARIANT, decide, fastest
from dlscale.optimize.measure import MeterSettings, measure
from dlscale.optimize.onnx_variants import build_file
from dlscale.optimize.report import write_report
from dlscale.optimize.results import OptimizeResult, Trial
from dlscale.optimize.slo import Progress, SloResult, SloSettings, tune_slo
from dlscale.optimize.staging import (
    MODEL_FILE,
    backend_options_of,
    copy_model,
    derived_config,
    folder_name,
    stage,
)
from dlscale.optimize.tf_variants import (
    ONNX_PREFIX,
    as_converted,
    convert,
    tensorflow_variants,
)
from dlscale.optimize.torch_build import TorchBuilder, TorchSource, torch_source
from dlscale.optimize.torch_variants import (
    PREFIX as TORCH_PREFIX,
)
from dlscale.optimize.torch_variants import (
    compile_refusal,
    torch_precision_variants,
    torch_runtime_variants,
)
from dlscale.optimize.variants import (
    DeviceCaps,
    ModelFacts,
    Skipped,
    Variant,
    detect_caps,
    model_facts,
    precision_variants,
    runtime_variants,
)
from dlscale.optimize.writing import write_version

#: Rows per batch when the guard runs the validation set.
GUARD_BATCH = 64
#: Share of the time budget the variant search may use when SLO tuning follows.
VARIANT_SHARE_WITH_SLO = 0.6
#: The backends a source version may run on: an FP32 ONNX file, or a TensorFlow model.
SOURCE_BACKENDS = ("onnxruntime", "tensorflow")


@dataclass(frozen=True)
class OptimizeSettings:
    """What `dlscale optimize` was asked for."""

    device: str = "auto"
    #: Largest deviation accepted, as a fraction (0.01 = 1%: one top-1 point, 1% disagreement).
    tolerance: float = 0.01
    metric: str = "auto"
    slo_p99_s: float | None = None
    time_budget_s: float = 600.0
    #: Try only variants whose names start with one of these (fp32 is always tried).
    only: tuple[str, ...] = ()
    #: Variants to try in stage one beside the generated ones (a setting the lists leave out);
    #: like every variant, one the device cannot run is reported failed with its reason.
    extra_variants: tuple[Variant, ...] = ()
    #: Stage two: graph levels, threads and layout on the best stage-one file.
    runtime_stage: bool = True
    #: Rejected variants are measured too, for the throughput-against-accuracy plot.
    measure_rejected: bool = True
    meter: MeterSettings = field(default_factory=MeterSettings)
    slo: SloSettings = field(default_factory=SloSettings)

    def check(self) -> None:
        """Refuse settings that cannot work, before any model is loaded."""
        if not 0 <= self.tolerance < 1:
            raise OptimizeError(f"tolerance {self.tolerance:g}: expected a fraction in [0, 1)")
        if self.time_budget_s <= 0:
            raise OptimizeError("the time budget must be positive")
        if self.slo_p99_s is not None and self.slo_p99_s <= 0:
            raise OptimizeError("the p99 bound must be positive")


def optimize(
    repo_root: Path, model: str, settings: OptimizeSettings, progress: Progress | None = None
) -> OptimizeResult:
    """Find the fastest variant within tolerance, write it as a new version, tune for the SLO."""
    settings.check()
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    budget_share = VARIANT_SHARE_WITH_SLO if settings.slo_p99_s else 1.0
    deadline = started + settings.time_budget_s * budget_share
    repo = ModelRepository(repo_root)
    source = repo.version(model)
    if source.config.backend not in SOURCE_BACKENDS:
        raise OptimizeError(
            f"{model} version {source.version} runs on {source.config.backend!r}; optimize "
            "starts from an FP32 ONNX version (backend = 'onnxruntime') or a TensorFlow model "
            "(backend = 'tensorflow'). Point config.toml back at one (backend and "
            "version_policy) to optimize again"
        )
    caps = detect_caps(settings.device)
    with tempfile.TemporaryDirectory(prefix=f".optimize-{model}-", dir=repo.root) as tmp:
        search = _Search(source, caps, settings, Path(tmp), say)
        trials, skipped = search.run(deadline)
        decision = decide(trials)
        winner = decision.winner
        say(f"winner: {decision.reason}")
        assert winner.folder is not None
        version: int | None = None
        if decision.keeps_source:
            version_dir = source.path  # the report goes beside the source; no copy is written
            previous = source.config.model_dump(mode="json", exclude_none=True)
        else:
            version, version_dir, previous = write_version(
                repo, source, winner.variant, winner.folder
            )
        slo = None
        if settings.slo_p99_s is not None:
            slo_deadline = started + settings.time_budget_s
            try:
                slo = tune_slo(
                    repo.root,
                    model,
                    settings.slo_p99_s,
                    caps,
                    settings.slo,
                    slo_deadline,
                    Path(tmp) / "slo",
                    say,
                )
            except DlscaleError as exc:
                # The version is written; the report says why tuning could not follow.
                slo = SloResult(settings.slo_p99_s, {}, [], None, note=f"not tuned: {exc}")
    result = OptimizeResult(
        model=model,
        source_version=source.version,
        device=caps.device,
        metric=search.metric,
        tolerance=settings.tolerance,
        data=search.data_summary(),
        trials=trials,
        skipped=skipped,
        winner=winner,
        written_version=version,
        version_dir=version_dir,
        decision=decision.reason,
        previous_config=previous,
        slo=slo,
        elapsed_s=time.monotonic() - started,
    )
    result.files = write_report(result, version_dir)
    return result


class _Search:
    """Stage one (precision files), then stage two (runtime settings on the best file)."""

    def __init__(
        self,
        source: ModelVersion,
        caps: DeviceCaps,
        settings: OptimizeSettings,
        scratch: Path,
        say: Progress,
    ) -> None:
        self.source = source
        self.caps = caps
        self.settings = settings
        self.scratch = scratch
        self.say = say
        kind = source.config.backend
        #: The variant that is the source as served: its trial always runs, others must beat it.
        self.source_variant = TF_SOURCE_VARIANT if kind == "tensorflow" else SOURCE_VARIANT
        backend = load_for_run(source, caps.device)
        try:
            inputs, outputs = reconcile(
                source.config, backend.inputs, backend.outputs, source.source
            )
            self.datasets: DataSets = load_datasets(source, inputs)
            self.reference = self._outputs(backend)
        finally:
            backend.unload()
        #: The FP32 ONNX file the ONNX variants are made from (a TensorFlow model's conversion).
        self.onnx_file: Path | None = source.model_file
        self.onnx_absent = ""
        if kind == "tensorflow":
            self.onnx_file, self.onnx_absent = self._converted([o.name for o in outputs])
        self.facts: ModelFacts = (
            model_facts(self.onnx_file) if self.onnx_file else ModelFacts({}, False, False)
        )
        self.torch: TorchSource | None = None
        self.torch_absent = ""
        if kind == "tensorflow":
            self.torch_absent = "PyTorch variants are made for ONNX sources of the zoo"
        elif not caps.torch:
            self.torch_absent = "PyTorch is not installed (pip install 'dlscale[torch]')"
        else:
            self.torch, self.torch_absent = torch_source(source)
        self._builder: TorchBuilder | None = None
        task = str(source.config.metadata.get("task", ""))
        self.metric = choose_metric(
            settings.metric,
            has_labels=self.datasets.labels is not None,
            outputs=self.reference,
            task=task,
        )

    def _converted(self, outputs: list[str]) -> tuple[Path | None, str]:
        """A TensorFlow source as ONNX (tf2onnx), or None and why it could not be converted."""
        signature = (self.source.config.backend_options.model_extra or {}).get("signature")
        self.say("converting to ONNX (tf2onnx)")
        try:
            target = self.scratch / "tf2onnx" / MODEL_FILE
            return convert(
                self.source.model_file, signature or "serving_default", outputs, target
            ), ""
        except OptimizeError as exc:
            return None, str(exc)

    def _tensorflow_first(
        self, onnx: list[Variant], skipped: list[Skipped]
    ) -> tuple[list[Variant], list[Skipped]]:
        """TensorFlow's own variants first, then the converted model's ONNX variants."""
        if self.onnx_file is None:
            return tensorflow_variants(), [Skipped(f"{ONNX_PREFIX}*", self.onnx_absent)]
        renamed = [Skipped(ONNX_PREFIX + s.name, s.reason) for s in skipped]
        return tensorflow_variants() + as_converted(onnx), renamed

    def data_summary(self) -> dict[str, Any]:
        d = self.datasets
        return {
            "validation": d.validation_source,
            "validation_rows": d.rows,
            "labels": d.labels is not None,
            "calibration": d.calibration_source,
        }

    def run(self, deadline: float) -> tuple[list[Trial], list[Skipped]]:
        has_calibration = self.datasets.calibration is not None
        first, skipped = precision_variants(self.facts, self.caps, has_calibration=has_calibration)
        if self.source.config.backend == "tensorflow":
            first, skipped = self._tensorflow_first(first, skipped)
        if self.torch is not None:
            more_first, more = torch_precision_variants(
                self.facts, self.caps, has_calibration=has_calibration
            )
            first, skipped = first + more_first, skipped + more
        else:
            skipped.append(Skipped(f"{TORCH_PREFIX}*", self.torch_absent))
        first_all = [*first, *self.settings.extra_variants]
        first = [v for v in first_all if self._wanted(v)]
        trials = [self._try(v, 1, deadline, always=v.name == self.source_variant) for v in first]
        onnx = [t for t in trials if t.variant.runtime == "onnxruntime" and t.accepted]
        if self.settings.runtime_stage and onnx:
            # Runtime settings are the runtime's own: each runtime's best file gets its own.
            best = fastest(onnx)
            second, more = runtime_variants(best.variant, self.facts, self.caps)
            accepted_torch = [t for t in trials if t.variant.runtime == "torch" and t.accepted]
            if accepted_torch:
                best_torch = fastest(accepted_torch)
                torch_second, torch_more = torch_runtime_variants(
                    best_torch.variant,
                    self.facts,
                    self.caps,
                    accepted=[t.variant for t in accepted_torch],
                )
                second, more = second + torch_second, more + torch_more
            skipped += more
            trials += [self._try(v, 2, deadline) for v in second if self._wanted(v)]
        names = sorted({v.name for v in first_all} | {s.name for s in skipped})
        only = self.settings.only
        if (
            only
            and all(t.variant.name == self.source_variant for t in trials)
            and not any(n.startswith(only) for n in names)
        ):  # a mistyped prefix; one that names a skipped variant gets the report's reason
            raise OptimizeError(
                f"--only {','.join(self.settings.only)}: no variant's name starts with it; "
                f"the variants here: {', '.join(names)}"
            )
        return trials, skipped

    def _wanted(self, variant: Variant) -> bool:
        only = self.settings.only
        return variant.name == self.source_variant or not only or variant.name.startswith(only)

    def _try(self, variant: Variant, stage_no: int, deadline: float, always: bool = False) -> Trial:
        trial = Trial(variant, stage_no)
        left = deadline - time.monotonic()
        if not always and left <= 0:
            trial.reason = "the time budget was spent before this variant's turn"
            return trial
        refusal = "" if always else compile_refusal(variant, self.facts, left)
        if refusal:
            trial.reason = refusal
            return trial
        self.say(f"trying {variant.name}")
        try:
            self._build_and_check(trial)
            if trial.accepted or self.settings.measure_rejected:
                assert trial.folder is not None
                trial.speed = measure(
                    trial.folder.parent,
                    trial.folder.name,
                    self.scratch / "loadgen" / trial.folder.name,
                    self.settings.meter,
                )
        except DlscaleError as exc:
            trial.status, trial.reason = "failed", str(exc)
        except Exception as exc:  # a runtime's own error: reported, and the search goes on
            trial.status, trial.reason = "failed", f"{type(exc).__name__}: {exc}"
        if trial.status == "failed":
            self.say(f"  {variant.name} failed: {trial.reason}")
        elif trial.accuracy is not None:
            speed = f", {trial.speed.offline_sps:,.1f} samples/s" if trial.speed else ""
            self.say(f"  {variant.name} {trial.status}: {trial.accuracy.describe()}{speed}")
        return trial

    def _build_and_check(self, trial: Trial) -> None:
        variant = trial.variant
        name = folder_name(variant.name)
        start = time.monotonic()
        built = self._build(variant, self.scratch / "build" / name)
        trial.build_s = time.monotonic() - start
        config = derived_config(
            self.source.config,
            name,
            backend=variant.runtime,
            backend_options=backend_options_of(
                self.source.config, variant.backend_options, variant.runtime
            ),
            instances=[{"count": 1, "device": self.caps.device}],
            **({} if variant.runtime == self.source.config.backend else {"platform": ""}),
        )
        backend = create_backend(variant.runtime, built, options_for(config, self.caps.device))
        backend.load()
        try:
            outputs = self._outputs(backend)
        finally:
            backend.unload()
        trial.accuracy = compare(
            self.metric, self.reference, outputs, self.settings.tolerance, self.datasets.labels
        )
        trial.status = "accepted" if trial.accuracy.accepted else "rejected"
        if not trial.accuracy.accepted:
            trial.reason = trial.accuracy.describe()
        trial.folder = stage(self.scratch / "repo", name, config, built, self.datasets.validation)

    def _build(self, variant: Variant, folder: Path) -> Path:
        """The variant's model file in `folder`, made from the FP32 ONNX file or the zoo."""
        if variant.runtime == "tensorflow":
            return copy_model(self.source.model_file, folder)
        if variant.runtime == "onnxruntime":
            if self.onnx_file is None:
                raise OptimizeError(f"variant {variant.name}: {self.onnx_absent}")
            built = folder / MODEL_FILE
            build_file(
                variant.recipe, variant.params, self.onnx_file, built, self.datasets.calibration
            )
            return built
        if variant.runtime != "torch":
            raise OptimizeError(f"variant {variant.name}: unknown runtime {variant.runtime!r}")
        if self.torch is None:
            raise OptimizeError(f"variant {variant.name}: {self.torch_absent}")
        if self._builder is None:
            self._builder = TorchBuilder(
                self.torch,
                self.scratch / "torch",
                self.datasets.validation,
                device=self.caps.device,
                max_batch_size=self.source.config.max_batch_size,
            )
        return self._builder.build(
            variant.recipe, folder, self.datasets.calibration, variant.params
        )

    def _outputs(self, backend: Any) -> Arrays:
        config = self.source.config
        batch = min(config.max_batch_size, GUARD_BATCH) if config.batched else 0
        return run_outputs(backend, self.datasets.validation, batch)
