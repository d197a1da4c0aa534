"""HAMi's node register annotation, in the encodings HAMi writes (Project-HAMi/HAMi 4707fb02)."""

from __future__ import annotations

import pytest

from fracpilot_libs.hami.register import RegisteredGpu, parse_register

# pkg/scheduler/scheduler_test.go: what MarshalNodeDevices writes for one hami-core GPU.
UPSTREAM_JSON = (
    '[{"id":"GPU-0","count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-A100",'
    '"numa":0,"health":true,"index":0,"mode":"hami-core"}]'
)
# docs/develop/protocol.md: the older encoding, seven fields per device.
UPSTREAM_LEGACY = (
    "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
    "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
)


def test_current_json_encoding() -> None:
    register = parse_register(UPSTREAM_JSON)
    assert register.problems == ()
    assert register.gpus == (
        RegisteredGpu("GPU-0", 10, 8192, 100, "NVIDIA-A100", True, 0, 0, "hami-core"),
    )


def test_legacy_encoding() -> None:
    register = parse_register(UPSTREAM_LEGACY)
    assert [g.uuid[-4:] for g in register.gpus] == ["b0ec", "1448"]
    assert {(g.count, g.memory_mib, g.cores, g.health, g.mode) for g in register.gpus} == {
        (10, 32768, 100, True, "hami-core")
    }
    nine = "GPU-a,5,16384,100,NVIDIA-T4,1,false,3,mig:"
    [gpu] = parse_register(nine).gpus
    assert (gpu.count, gpu.numa, gpu.health, gpu.index, gpu.mode) == (5, 1, False, 3, "mig")


def test_zero_values_are_omitted_by_go() -> None:
    """``omitempty``: a GPU registered unhealthy has no ``health`` field; index 0 none."""
    [gpu] = parse_register('[{"id":"GPU-1","count":10,"devmem":15360,"devcore":100}]').gpus
    assert (gpu.health, gpu.index, gpu.numa, gpu.type) == (False, 0, 0, "")


def test_a_gpu_without_memory_is_named_and_left_out() -> None:
    text = '[{"id":"GPU-2","count":10},{"id":"GPU-3","count":10,"devmem":100,"health":true}]'
    register = parse_register(text)
    assert [g.uuid for g in register.gpus] == ["GPU-3"]
    assert register.problems == ("hami.io/node-nvidia-register: device GPU-2 registers no memory",)


@pytest.mark.parametrize(
    "text",
    [
        "[not json",
        '{"id":"GPU-1"}',
        "nothing here",
        '[{"id":"GPU-1","count":10,"devmem":"lots"}]',  # Go's Unmarshal fails as a whole
        '[{"count":1,"devmem":100}]',
        "[7]",
        "GPU-x,10,abc,100,t,0,true:",
        "GPU-x,10,100,100,t,0:",
    ],
)
def test_unreadable_annotations_raise(text: str) -> None:
    """HAMi then registers no GPU on the node; the inventory reports the node."""
    with pytest.raises(ValueError, match=r"hami\.io/node-nvidia-register"):
        parse_register(text)
