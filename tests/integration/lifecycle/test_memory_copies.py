"""Issue 36: one model file served under many names (a copy per customer) is measured as one.

A real server loading on demand under a budget (tritonclient over REST, 127.0.0.1 port 0)
serves six names whose version folder is a link to one folder (one file, one config less the
name), one name that links to the same folder under another config (two instances), and is
asked for each in turn. The tests count the server's memory readings and read the sizes the
index reports, never a time (docs/memory.md, "Sizes known by file").
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from tests.toolkit.models import write_null_model
from tests.toolkit.python_models import write_python_model
from tests.toolkit.server import LocalServer, serving

from dlscale.serving.memory.ledger import MEASURES

MiB = 2**20
#: Room for every model without an eviction: no freed memory, so every reading that could
#: change a size is taken (the rule under test is which loads read, not the trims').
BUDGET = 200 * MiB
COPIES = [f"copy{i}" for i in range(6)]
CONFIG = (
    "max_batch_size = 4\n"
    '[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)
WIDE = CONFIG + "[[instances]]\ncount = 2\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("copies")
    source = write_null_model(tmp_path_factory.mktemp("source"), "source", CONFIG)
    with open(source / "1" / "pad.bin", "wb") as pad:
        pad.truncate(10 * MiB)  # a load holds at least its files: 10 MiB an instance
    for name, config in [*((c, CONFIG) for c in COPIES), ("wide", WIDE)]:
        (root / name).mkdir()
        (root / name / "config.toml").write_text('backend = "null"\n' + config)
        (root / name / "1").symlink_to(source / "1", target_is_directory=True)
    with serving(
        root, model_control="on-demand", load_models=(), memory_budget=(("cpu", BUDGET),)
    ) as started:
        yield started


def ask(server: LocalServer, names: list[str]) -> None:
    """One request for each name in turn, each answered y = x."""
    with triton.InferenceServerClient(server.http_url, network_timeout=120) as client:
        for name in names:
            x = triton.InferInput("x", [1, 2], "FP32")
            x.set_data_from_numpy(np.ones((1, 2), np.float32))
            assert client.infer(name, [x]).as_numpy("y").tolist() == [[1.0, 1.0]], name


def _asked(server: LocalServer, name: str) -> str | None:
    """`ask` for one name: None, or what the server answered instead."""
    try:
        ask(server, [name])
    except Exception as exc:  # the refusal's text, shown with the loads' figures
        return f"{name}: {exc}"
    return None


def sizes(server: LocalServer) -> dict[str, int]:
    with triton.InferenceServerClient(server.http_url) as client:
        rows = client.get_model_repository_index()
    return {r["name"]: r["memory"]["cpu"] for r in rows if r["state"] == "READY"}


def test_copies_of_one_file_are_measured_as_one_and_a_config_of_its_own_apart(
    server: LocalServer,
) -> None:
    ledger = server.dataplane.manager.memory
    ask(server, COPIES)
    # The file's first loads are measured (the first carries the runtime's set-up, the second
    # corrects it), each with a reading before and after; the other names take the size known
    # for the file and read nothing. Before, every name's first loads were read: 12 readings.
    assert ledger.load_seconds.count == len(COPIES)
    assert ledger.readings == 2 * MEASURES < 2 * len(COPIES), ledger.readings
    held = sizes(server)
    assert sorted(held) == COPIES
    known = [held[c] for c in COPIES[MEASURES:]]
    assert all(size == known[0] >= 10 * MiB for size in known), held
    # The same file under another config (two instances) is another footprint: measured.
    ask(server, ["wide"])
    assert ledger.readings == 2 * MEASURES + 2, ledger.readings
    assert sizes(server)["wide"] >= 2 * 10 * MiB
    assert ledger.peak["cpu"] <= BUDGET and sum(sizes(server).values()) <= BUDGET


def test_a_changed_file_is_measured_again(server: LocalServer) -> None:
    ledger = server.dataplane.manager.memory
    with triton.InferenceServerClient(server.http_url) as client:
        client.unload_model(COPIES[-1])
        pad = Path(server.dataplane.manager.repository.root) / COPIES[-1] / "1" / "model.null"
        pad.write_bytes(b"changed")  # the shared file, changed: every copy's size is unknown
        readings = ledger.readings
        client.load_model(COPIES[-1])
    assert ledger.readings == readings + 2, (readings, ledger.readings)
    assert sizes(server)[COPIES[-1]] >= 10 * MiB


#: y = x; the process's first load of it grows by 100 MiB once (a runtime's one-time set-up,
#: as ONNX Runtime's threads and arenas are: 33.6 MiB, then 3.2 MiB a copy of the bench's MLP).
SET_UP_ONCE = """
import sys
import types

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        once = sys.modules.setdefault("SET_UP_KEY", types.ModuleType("set_up"))
        if not hasattr(once, "arena"):
            once.arena = b"\\1" * (100 * 2**20)

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("y", x)]) for x in xs]
"""


@pytest.fixture
def set_up_key() -> Iterator[str]:
    """The module under which this test's models keep their set-up: one per test, dropped after
    it. The set-up lives in the process, which is this pytest worker: under one shared name the
    second test of a worker found it made and measured no growth (every copy 56 KiB in a CI run)."""
    key = f"_dlscale_test_set_up_{uuid.uuid4().hex}"
    yield key
    sys.modules.pop(key, None)


def python_copies(tmp_path: Path, names: list[str], key: str) -> Path:
    """A repository of `names`, each linked to one Python model that sets up once under `key`."""
    config = CONFIG + '[backend_options]\nisolation = "thread"\n'  # in the server's process
    code = SET_UP_ONCE.replace("SET_UP_KEY", key)
    source = write_python_model(tmp_path / "source", "source", code, config)
    root = tmp_path / "repo"
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "config.toml").write_text('backend = "python"\n' + config)
        (root / name / "1").symlink_to(source / "1", target_is_directory=True)
    return root


#: The first copy holds 100 to 150 MiB (the set-up, and the Python backend's own imports when
#: it is the process's first Python model); the others a few MiB. Taken as the file's size, the
#: first figure does not fit twice: a second copy would evict the first.
SET_UP_BUDGET = 180 * MiB
#: The least a load that made the set-up is measured at: the growth of the process's resident
#: memory, less the pages its allocator already held and reused (99.87 MiB in a run).
SET_UP_SEEN = 90 * MiB


def test_the_second_load_of_a_file_corrects_the_first_ones_set_up(
    tmp_path: Path, set_up_key: str
) -> None:
    names = [f"py{i}" for i in range(4)]
    with serving(
        python_copies(tmp_path, names, set_up_key),
        model_control="on-demand",
        load_models=(),
        memory_budget=(("cpu", SET_UP_BUDGET),),
    ) as server:
        ask(server, names)
        held = sizes(server)
        ledger = server.dataplane.manager.memory
        assert sorted(held) == names and ledger.evictions == 0, (held, ledger.evictions)
        assert held[names[0]] >= SET_UP_SEEN, held  # the first measured the set-up
        assert all(held[n] < held[names[0]] for n in names[1:]), held
        assert held[names[2]] == held[names[3]] <= held[names[1]], held
        assert ledger.peak["cpu"] <= SET_UP_BUDGET


def test_copies_asked_at_once_keep_the_corrected_size(
    tmp_path: Path, set_up_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    names = [f"py{i}" for i in range(4)]
    with (
        caplog.at_level(logging.INFO, logger="dlscale.models"),
        serving(
            python_copies(tmp_path, names, set_up_key),
            model_control="on-demand",
            load_models=(),
            memory_budget=(("cpu", SET_UP_BUDGET),),
        ) as server,
    ):
        # All at once: the loads behind the file's measurements wait for their turns, and read
        # its size once they have them (read before, it was the first figure, written back).
        with ThreadPoolExecutor(len(names)) as pool:
            asked = list(pool.map(lambda n: _asked(server, n), names))
        loads = [r.getMessage() for r in caplog.records if "loaded in" in r.getMessage()]
        assert asked == [None] * len(names), (asked, loads)  # the ledger's figures, load by load
        held = sizes(server)
        ledger = server.dataplane.manager.memory
        assert sorted(held) == names and ledger.evictions == 0, (held, ledger.evictions, loads)
        assert max(held.values()) >= SET_UP_SEEN, held  # one of them measured the set-up
        assert sum(size < max(held.values()) for size in held.values()) == 3, held
        assert ledger.peak["cpu"] <= SET_UP_BUDGET
