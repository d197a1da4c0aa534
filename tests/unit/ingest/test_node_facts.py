"""HAMi's node register annotation: device memory per GPU, in both formats HAMi decodes."""

from __future__ import annotations

from typing import Any

from fracpilot_ingest.node_facts import (
    HAMI_REGISTER,
    hami_device_memory,
    node_projection,
    register_memory,
)
from support.gpu_exporter import GpuState, hami_node_register

MIB = 1024**2
A = GpuState("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", "n1", "NVIDIA A100-SXM4-80GB", 81_920, 0)
B = GpuState("GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52", "n1", "Tesla T4", 15_360, 0, index=1)


def node(annotation: str | None) -> dict[str, Any]:
    notes = {"other": "x"} | ({HAMI_REGISTER: annotation} if annotation is not None else {})
    return {"kind": "Node", "metadata": {"name": "n1", "annotations": notes}, "status": {}}


def test_current_json_register() -> None:
    text = hami_node_register([A, B])
    assert text.startswith('[{"id":"GPU-0fc3eda5')
    assert register_memory(text) == {A.uuid: 81_920 * MIB, B.uuid: 15_360 * MIB}


def test_legacy_register() -> None:
    text = hami_node_register([A, B], legacy=True)
    assert register_memory(text) == {A.uuid: 81_920 * MIB, B.uuid: 15_360 * MIB}
    seven_fields = f"{A.uuid},10,81920,100,NVIDIA-NVIDIA A100-SXM4-80GB,0,true:"
    assert register_memory(seven_fields) == {A.uuid: 81_920 * MIB}


def test_garbage_gives_nothing() -> None:
    assert register_memory("[not json") == {}
    assert register_memory('[{"id":"GPU-x","devmem":"lots"},7]') == {}
    assert register_memory("GPU-x,10,abc,100,t,0,true:") == {}


def test_over_nodes_and_projection() -> None:
    kept = node_projection(node(hami_node_register([A])))
    assert kept["metadata"]["annotations"] == {HAMI_REGISTER: hami_node_register([A])}
    assert "status" not in kept
    assert hami_device_memory([kept, node(None)]) == {A.uuid: 81_920 * MIB}
