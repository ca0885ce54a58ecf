"""flor.launch.launcher: the GPUs a launch places its workers on."""

from __future__ import annotations

from flor.launch.launcher import detect_gpus


def test_gpu_selection():
    assert detect_gpus("none", {}) == []
    assert detect_gpus("0,2", {}) == ["0", "2"]
    assert detect_gpus("auto", {"CUDA_VISIBLE_DEVICES": "3,5"}) == ["3", "5"]
    assert detect_gpus("auto", {"CUDA_VISIBLE_DEVICES": ""}) == []
