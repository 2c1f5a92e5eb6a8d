"""A load's one trip to its instance's thread (docs/memory.md, "Where a load's time goes"): the
signature check and the warm-up run there, right after the backend loads, and what they find
still refuses the load with a 400 that says why, while the server serves on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from tests.toolkit.models import Mlp, write_model
from tests.toolkit.server import serving
from tritonclient.utils import InferenceServerException

CONFIG = (
    'max_batch_size = 8\n[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [WIDTH]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [8]\n'
)


def test_a_config_that_disagrees_with_its_model_is_refused_in_the_load_trip(
    tmp_path: Path,
) -> None:
    write_model(tmp_path, "good", Mlp.seeded(0, (16, 32, 8)).graph(), CONFIG.replace("WIDTH", "16"))
    # The file takes 16 floats; the config says 24.
    write_model(tmp_path, "bad", Mlp.seeded(1, (16, 32, 8)).graph(), CONFIG.replace("WIDTH", "24"))
    with serving(tmp_path, model_control="explicit", load_models=("good",)) as server:
        client = triton.InferenceServerClient(server.http_url)
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("bad")
        assert caught.value.status() == "400"
        assert "inputs.x.shape" in str(caught.value) and "[-1, 24]" in str(caught.value)
        assert not client.is_model_ready("bad")
        x = triton.InferInput("x", [2, 16], "FP32")
        x.set_data_from_numpy(np.ones((2, 16), np.float32))
        assert client.infer("good", [x]).as_numpy("y").shape == (2, 8)
        client.close()
