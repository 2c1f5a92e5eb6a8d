"""BYTES samples from a folder (bounded, confined) or the zoo, and the per-step breakdown's rule."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dlscale.bench import byte_samples
from dlscale.bench.steps import Counters, Snapshot, Step, breakdown
from dlscale.errors import BenchError
from dlscale.types import Datatype, TensorSpec

IMAGE = [TensorSpec("image", Datatype.BYTES, (1,))]


def _folder(tmp_path: Path, files: dict[str, bytes]) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_files_come_in_name_order_one_element_per_row(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"b.txt": b"second", "a.txt": b"first", "c.txt": b""})
    arrays, source = byte_samples.from_folder(folder, IMAGE, 10, 1 << 20)
    column = arrays["image"]
    assert column.shape == (3, 1) and column.dtype == object
    assert list(column[:, 0]) == [b"first", b"second", b""]
    assert "3 files" in source


def test_count_and_memory_budget_bound_the_samples(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {f"{i}.bin": bytes(100) for i in range(10)})
    assert len(byte_samples.from_folder(folder, IMAGE, 4, 1 << 20)[0]["image"]) == 4
    # 250 bytes of budget: two files fit, the third would pass it.
    assert len(byte_samples.from_folder(folder, IMAGE, 10, 250)[0]["image"]) == 2


def test_a_file_above_the_bound_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(byte_samples, "MAX_FILE_BYTES", 64)
    folder = _folder(tmp_path, {"big.jpg": bytes(65)})
    with pytest.raises(BenchError, match="larger than"):
        byte_samples.from_folder(folder, IMAGE, 10, 1 << 20)


def test_a_folder_of_too_many_entries_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(byte_samples, "MAX_ENTRIES", 3)
    folder = _folder(tmp_path, {f"{i}": b"x" for i in range(5)})
    with pytest.raises(BenchError, match="more than 3 entries"):
        byte_samples.from_folder(folder, IMAGE, 10, 1 << 20)


def test_links_hidden_files_and_subfolders_are_left_out(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"outside the folder")
    folder = _folder(tmp_path, {".hidden": b"h"})
    (folder / "sub").mkdir()
    os.symlink(tmp_path / "secret", folder / "link")
    with pytest.raises(BenchError, match="no regular, non-hidden file"):
        byte_samples.from_folder(folder, IMAGE, 10, 1 << 20)


def test_a_file_swapped_for_a_link_after_the_listing_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"outside the folder")
    folder = _folder(tmp_path, {})
    os.symlink(tmp_path / "secret", folder / "photo.jpg")
    # The read itself refuses links (O_NOFOLLOW), whatever the listing saw before.
    with pytest.raises(BenchError, match="cannot be read"):
        byte_samples._read_bounded(folder / "photo.jpg")


@pytest.mark.parametrize(
    ("specs", "match"),
    [
        ([TensorSpec("x", Datatype.FP32, (4,))], "one BYTES input"),
        ([*IMAGE, TensorSpec("y", Datatype.BYTES, (1,))], "one BYTES input"),
        ([TensorSpec("image", Datatype.BYTES, (3,))], "3] elements per row"),
    ],
)
def test_a_folder_fits_models_with_one_bytes_element_per_row(
    tmp_path: Path, specs: list[TensorSpec], match: str
) -> None:
    folder = _folder(tmp_path, {"a": b"x"})
    with pytest.raises(BenchError, match=match):
        byte_samples.from_folder(folder, specs, 10, 1 << 20)


def test_not_a_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="not a folder"):
        byte_samples.from_folder(tmp_path / "missing", IMAGE, 10, 1 << 20)


def test_the_zoo_gives_jpegs_for_images_and_sentences_for_text() -> None:
    made = byte_samples.from_zoo("some-pipeline", IMAGE, 3, seed=1)
    assert made is not None
    images = made[0]["image"][:, 0]
    assert len(images) == 3 and all(i.startswith(b"\xff\xd8\xff") for i in images)
    texts = byte_samples.from_zoo("bert-e2e", [TensorSpec("text", Datatype.BYTES, (1,))], 2, 0)
    assert texts is not None and all(t.decode().strip() for t in texts[0]["text"][:, 0])
    assert byte_samples.from_zoo("x", [TensorSpec("blob", Datatype.BYTES, (1,))], 2, 0) is None


def _snapshot(at_ns: int, *steps: Counters) -> Snapshot:
    pipeline = Counters(requests=sum(s.requests for s in steps[:1]), request_ns=at_ns)
    return Snapshot(pipeline, steps, at_ns)


def test_the_busiest_step_limits_the_pipeline_and_times_are_per_request() -> None:
    steps = [Step(1, "decode", 2), Step(2, "model", 1)]
    before = _snapshot(0, Counters(), Counters())
    # 100 requests in 1 s: decode busy 1.2 s over 2 instances (60%), model 0.8 s over 1 (80%).
    decode = Counters(100, 0, 10**8, 3 * 10**8, 100, 100, 12 * 10**8)
    model = Counters(100, 0, 2 * 10**8, 2 * 10**8, 100, 25, 8 * 10**8)
    after = Snapshot(Counters(100, 10**9), (decode, model), 10**9)
    out = breakdown("p", steps, before, after)
    assert out is not None
    first, second = out["steps"]
    assert first["queue_ms"] == pytest.approx(1.0) and first["compute_ms"] == pytest.approx(3.0)
    assert second["mean_batch"] == 4.0 and second["busy_ms_per_row"] == pytest.approx(8.0)
    assert first["busy_share"] == pytest.approx(0.6) and second["busy_share"] == pytest.approx(0.8)
    assert out["limiting_step"] == {"step": 2, "model": "model"}
    assert out["server_ms"] == pytest.approx(10.0)
    assert out["between_steps_ms"] == pytest.approx(10.0 - 4.0 - 4.0)
    assert breakdown("plain", [], before, after) is None
    assert np.isfinite(out["seconds"])
