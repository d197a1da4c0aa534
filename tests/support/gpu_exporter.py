"""A test exporter serving GPU metrics in the formats fracpilot ingests, with known values.

The model is two small dataclasses: :class:`GpuState` (one physical GPU on a node) holding the
:class:`PodOnGpu` entries sharing it. Builders render them in each exporter's format and
return an :class:`Exposition` (samples you can inspect, add together and render as text);
:class:`GpuTestExporter` serves that text over HTTP for a real Prometheus to scrape.

Formats and units (the same physical quantity in different units per exporter):

==================================  ==========================================  =============
builder / metric                     what                                        unit
==================================  ==========================================  =============
dcgm  ``DCGM_FI_DEV_GPU_UTIL``       device utilisation; per pod in per-process  percent 0-100
dcgm  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` graphics engine active                   ratio 0-1
dcgm  ``DCGM_FI_DEV_FB_USED/_FREE``  framebuffer used / free; per pod (USED)     MiB
dcgm  ``DCGM_FI_DEV_FB_RESERVED``    framebuffer the driver reserves (4.3.1+)    MiB
dcgm  ``DCGM_FI_DEV_FB_TOTAL``       framebuffer total (only when configured)    MiB
HAMi  ``*_bytes``                    memory used / limit                         bytes
HAMi  ``*_utilization_ratio`` and    SM / core utilisation, despite "ratio"      percent 0-100
      legacy ``HostCoreUtilization``,
      ``Device_utilization_desc_of_container``
HAMi  ``*_last_kernel_*``            seconds since the container's last kernel   seconds
vLLM  ``vllm:gpu_cache_usage_perc``, KV-cache blocks in use, despite "perc"       ratio 0-1
      ``vllm:kv_cache_usage_perc``
vLLM  ``vllm:num_requests_*``        requests waiting / running                  count
vLLM  ``vllm:num_preemptions_total`` requests preempted (a counter)              count
==================================  ==========================================  =============

Label sets (``gpu``-level labels first; see each builder for details):

- dcgm device: ``gpu, UUID, pci_bus_id, device, modelName, Hostname|hostname,
  [DCGM_FI_DRIVER_VERSION], container, namespace, pod`` (``container_name, pod_namespace,
  pod_name`` with ``use_old_namespace``); pod labels are "" on an idle GPU. With
  ``virtual_gpus`` every sharing pod gets a copy with the *device* value plus ``vgpu``.
- dcgm MIG (``internal/pkg/collector/gpu_collector.go``, ``rendermetrics/render_metrics.go``
  at d5e5f510): a GPU with GPU instances exports, in the default flex mode, one series per
  instance and none for the GPU itself; each carries the parent's labels plus
  ``GPU_I_PROFILE`` (e.g. ``3g.40gb``) and ``GPU_I_ID`` right after ``modelName``, and the
  pod labels of the pod holding that instance. ``DCGM_FI_DEV_GPU_UTIL`` has no value on an
  instance (NVML does not give it), so it is left out; ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` and
  the FB figures are the instance's own.
- dcgm per-process (dcgm-exporter >= 4.5.3-4.8.2 with ``--kubernetes-virtual-gpus``): the
  device labels + ``container, namespace, pod, pod_uid, vgpu`` with the *pod's* value, only for
  ``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_FB_USED``. ``pod_uid`` tells them apart from the
  fanned-out device copies.
- HAMi v2.9+ host: ``node, device_index, device_uuid, device_type, zone``
  (``hami_host_gpu_memory_controller_utilization_ratio`` has no ``node``); per container:
  ``namespace, pod, container, vdevice_index, device_uuid, zone``.
- HAMi legacy host: ``nodeid, deviceidx, deviceuuid, devicetype, zone`` (no ``nodeid`` before
  v2.9 with ``legacy_host_nodeid=False``, as in v2.8.3); per container: ``podnamespace,
  podname, ctrname, vdeviceid, deviceuuid, zone`` (+ ``context, module, data, offset`` on
  ``Device_memory_desc_of_container``).
  ``zone="vGPU"`` is added to every HAMi vGPUmonitor series by its registry wrapper;
  ``device_type`` is ``"NVIDIA-" + model``.
- vLLM: ``model_name, [engine], [namespace, pod, container]`` - vLLM itself emits only
  ``model_name`` (and ``engine`` since V1); in a cluster pod labels come from the scrape target,
  so ``pod_labels=False`` renders one pod's metrics for a per-pod target with static labels.

Only the standard library is used.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Literal

from support.serving_thread import QuietHandler, ServingThread

__all__ = [
    "MIB",
    "Exposition",
    "GpuState",
    "GpuTestExporter",
    "MigInstanceState",
    "PodOnGpu",
    "Sample",
    "VllmState",
    "dcgm_device_metrics",
    "dcgm_metrics",
    "dcgm_per_process_metrics",
    "hami_metrics",
    "hami_node_register",
    "hami_scheduler_metrics",
    "vllm_metrics",
    "vllm_metrics_for_pod",
]

MIB = 1024 * 1024
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

HostnameLabel = Literal["Hostname", "hostname"]
HamiNames = Literal["current", "legacy", "both"]
KvCacheMetric = Literal["kv_cache_usage_perc", "gpu_cache_usage_perc", "both"]


# ---- model -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VllmState:
    """What one vLLM server reports. ``kv_cache_usage`` is a fraction 0-1."""

    model_name: str = "meta-llama/Llama-3.1-8B-Instruct"
    kv_cache_usage: float = 0.0
    num_requests_waiting: int = 0
    num_requests_running: int = 0
    num_preemptions: int = 0  # the counter ``vllm:num_preemptions_total``

    def __post_init__(self) -> None:
        _check_range("kv_cache_usage", self.kv_cache_usage, 0.0, 1.0)


@dataclass(frozen=True)
class PodOnGpu:
    """One container's share of one GPU.

    ``util_pct`` is the pod's SM utilisation as a percent of the whole GPU (what dcgm's
    per-process ``DCGM_FI_DEV_GPU_UTIL`` and HAMi's container utilisation report).
    ``memory_limit_mib`` is HAMi's ``nvidia.com/gpumem`` (None: the whole card).
    ``pod_uid`` defaults to a stable UUID derived from namespace/pod; ``vgpu`` (the
    time-slicing replica id) defaults to the pod's position on the GPU.
    """

    namespace: str
    pod: str
    container: str
    util_pct: float
    memory_used_mib: int
    memory_limit_mib: int | None = None
    pod_uid: str | None = None
    vgpu: str | None = None
    vdevice_index: int = 0
    last_kernel_seconds_ago: float | None = 1.0
    vllm: VllmState | None = None

    def __post_init__(self) -> None:
        _check_range("util_pct", self.util_pct, 0.0, 100.0)
        if self.memory_used_mib < 0:
            raise ValueError(f"memory_used_mib must be >= 0, got {self.memory_used_mib}")
        if self.memory_limit_mib is not None and self.memory_limit_mib <= 0:
            raise ValueError(f"memory_limit_mib must be > 0, got {self.memory_limit_mib}")

    @property
    def uid(self) -> str:
        if self.pod_uid:
            return self.pod_uid
        return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"pod://{self.namespace}/{self.pod}"))

    @property
    def memory_used_bytes(self) -> int:
        return self.memory_used_mib * MIB


@dataclass(frozen=True)
class MigInstanceState:
    """One MIG GPU instance of a GpuState, and the pod holding it (if any).

    ``gr_engine_active`` (0-1) is relative to the instance, as DCGM reports it;
    ``fb_metrics=False`` renders an instance that exports no FB figures (dcgm-exporter
    issues 380 and 512)."""

    instance_id: int
    profile: str
    memory_total_mib: int
    gr_engine_active: float
    pod: PodOnGpu | None = None
    fb_metrics: bool = True

    def __post_init__(self) -> None:
        _check_range("gr_engine_active", self.gr_engine_active, 0.0, 1.0)
        if self.fb_used_mib > self.memory_total_mib:
            raise ValueError(f"GI {self.instance_id}: memory used above its total")

    @property
    def fb_used_mib(self) -> int:
        return self.pod.memory_used_mib if self.pod is not None else 0


@dataclass(frozen=True)
class GpuState:
    """One physical GPU and the pods sharing it.

    ``util_pct`` is the device's utilisation (``DCGM_FI_DEV_GPU_UTIL``, HAMi host utilisation).
    ``memory_used_mib`` defaults to the sum of the pods' memory; ``gr_engine_active`` (0-1)
    defaults to ``util_pct / 100``. ``index`` gives ``gpu``, ``device=nvidia<index>`` and
    HAMi's ``device_index``. ``memory_reserved_mib`` (the driver's reserve) renders
    ``DCGM_FI_DEV_FB_RESERVED`` and is not free (free = total - used - reserved);
    ``fb_total`` renders ``DCGM_FI_DEV_FB_TOTAL``. ``mig`` lists GPU instances: dcgm then
    renders those instead of the GPU (``pods`` is ignored by dcgm).
    """

    uuid: str
    node: str
    model: str
    memory_total_mib: int
    util_pct: float
    pods: Sequence[PodOnGpu] = ()
    index: int = 0
    memory_used_mib: int | None = None
    gr_engine_active: float | None = None
    memory_util_pct: float = 0.0
    pci_bus_id: str | None = None
    memory_reserved_mib: int | None = None
    fb_total: bool = False
    mig: Sequence[MigInstanceState] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "pods", tuple(self.pods))
        object.__setattr__(self, "mig", tuple(self.mig))
        _check_range("util_pct", self.util_pct, 0.0, 100.0)
        _check_range("memory_util_pct", self.memory_util_pct, 0.0, 100.0)
        if self.gr_engine_active is not None:
            _check_range("gr_engine_active", self.gr_engine_active, 0.0, 1.0)
        if not 0 <= self.fb_used_mib + (self.memory_reserved_mib or 0) <= self.memory_total_mib:
            raise ValueError(
                f"{self.uuid}: memory used {self.fb_used_mib} MiB "
                f"outside 0..{self.memory_total_mib}"
            )
        names = [(p.namespace, p.pod, p.container) for p in self.pods]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.uuid}: a container is listed twice: {names}")

    @property
    def fb_used_mib(self) -> int:
        if self.memory_used_mib is not None:
            return self.memory_used_mib
        return sum(p.memory_used_mib for p in self.pods)

    @property
    def fb_free_mib(self) -> int:
        return self.memory_total_mib - self.fb_used_mib - (self.memory_reserved_mib or 0)

    @property
    def gr_active(self) -> float:
        if self.gr_engine_active is not None:
            return self.gr_engine_active
        return self.util_pct / 100.0

    @property
    def device(self) -> str:
        return f"nvidia{self.index}"

    @property
    def bus_id(self) -> str:
        return self.pci_bus_id or f"00000000:{0x10 + self.index:02X}:00.0"

    @property
    def hami_device_type(self) -> str:
        return f"NVIDIA-{self.model}"

    def memory_limit_bytes(self, pod: PodOnGpu) -> int:
        """HAMi's limit for ``pod`` on this GPU: its gpumem, or the whole card."""
        limit = pod.memory_limit_mib if pod.memory_limit_mib is not None else self.memory_total_mib
        return limit * MIB


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if math.isnan(value) or not low <= value <= high:
        raise ValueError(f"{name} must be within {low}..{high}, got {value}")


# ---- samples and text exposition -------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Labels
    value: float

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    def line(self) -> str:
        if not self.labels:
            return f"{self.name} {_format_value(self.value)}"
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in self.labels)
        return f"{self.name}{{{inner}}} {_format_value(self.value)}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


# (type, help) per metric name; written in our own words.
METRIC_INFO: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_DEV_FB_TOTAL": ("gauge", "Framebuffer memory total (in MiB)."),
    "hami_host_gpu_memory_used_bytes": ("gauge", "Physical GPU memory used, bytes."),
    "hami_host_gpu_utilization_ratio": ("gauge", "Physical GPU core utilization, 0-100."),
    "hami_host_gpu_memory_controller_utilization_ratio": (
        "gauge",
        "Physical GPU memory controller utilization, 0-100.",
    ),
    "hami_vgpu_memory_used_bytes": ("gauge", "Container vGPU memory used, bytes."),
    "hami_vgpu_memory_limit_bytes": ("gauge", "Container vGPU memory limit, bytes."),
    "hami_container_device_memory_bytes": ("gauge", "Container device memory, bytes."),
    "hami_container_device_utilization_ratio": ("gauge", "Container SM utilization, 0-100."),
    "hami_container_last_kernel_elapsed_seconds": ("gauge", "Seconds since the last kernel."),
    "hami_vgpu_memory_context_bytes": ("gauge", "Container CUDA context memory, bytes."),
    "hami_vgpu_memory_module_bytes": ("gauge", "Container module memory, bytes."),
    "hami_vgpu_memory_buffer_bytes": ("gauge", "Container buffer memory, bytes."),
    "hami_gpu_memory_limit_bytes": ("gauge", "Registered memory of a GPU, bytes."),
    "GPUDeviceMemoryLimit": ("gauge", "Registered memory of a GPU, bytes (legacy name)."),
    "HostGPUMemoryUsage": ("gauge", "Physical GPU memory used, bytes (legacy name)."),
    "HostCoreUtilization": ("gauge", "Physical GPU core utilization, 0-100 (legacy name)."),
    "vGPU_device_memory_usage_in_bytes": ("gauge", "Container vGPU memory used (legacy name)."),
    "vGPU_device_memory_limit_in_bytes": ("gauge", "Container vGPU memory limit (legacy name)."),
    "Device_memory_desc_of_container": ("gauge", "Container device memory (legacy name)."),
    "Device_utilization_desc_of_container": ("gauge", "Container SM utilization (legacy name)."),
    "Device_last_kernel_of_container": ("gauge", "Seconds since last kernel (legacy name)."),
    "vllm:gpu_cache_usage_perc": ("gauge", "KV-cache usage, 1 means 100 percent."),
    "vllm:kv_cache_usage_perc": ("gauge", "KV-cache usage, 1 means 100 percent."),
    "vllm:num_requests_waiting": ("gauge", "Requests waiting to be processed."),
    "vllm:num_requests_running": ("gauge", "Requests running on the GPU."),
    "vllm:num_preemptions_total": ("counter", "Cumulative number of preemptions."),
}


class Exposition:
    """An ordered list of samples; ``+`` concatenates, :meth:`text` renders the exposition
    format with each metric family's samples grouped under one HELP/TYPE header."""

    def __init__(self, samples: Iterable[Sample] = ()) -> None:
        self.samples: list[Sample] = list(samples)

    def __add__(self, other: Exposition) -> Exposition:
        return Exposition([*self.samples, *other.samples])

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def add(self, name: str, labels: Sequence[tuple[str, str]], value: float) -> None:
        self.samples.append(Sample(name, tuple(labels), float(value)))

    def names(self) -> list[str]:
        return list(dict.fromkeys(s.name for s in self.samples))

    def find(self, name: str, **labels: str) -> list[Sample]:
        return [
            s
            for s in self.samples
            if s.name == name and all(s.label(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float:
        """The one sample matching ``name`` and ``labels`` (AssertionError otherwise)."""
        found = self.find(name, **labels)
        if len(found) != 1:
            raise AssertionError(f"{len(found)} samples match {name} {labels}")
        return found[0].value

    def label_sets(self, name: str) -> list[tuple[str, ...]]:
        """Distinct label-name tuples used by ``name`` (to document or assert a format)."""
        return list(dict.fromkeys(tuple(k for k, _ in s.labels) for s in self.find(name)))

    def text(self) -> str:
        families: dict[str, list[Sample]] = {}
        for sample in self.samples:
            families.setdefault(sample.name, []).append(sample)
        lines: list[str] = []
        for name, samples in families.items():
            kind, help_text = METRIC_INFO.get(name, ("untyped", name))
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            seen: set[Labels] = set()
            for sample in samples:
                if sample.labels in seen:
                    raise ValueError(f"duplicate series {sample.line()}")
                seen.add(sample.labels)
                lines.append(sample.line())
        return "\n".join(lines) + "\n" if lines else ""


# ---- dcgm-exporter -----------------------------------------------------------------------------

# A reader returns None where the exporter has no value (the series is left out).
_DCGM_DEVICE_METRICS: tuple[tuple[str, Callable[[GpuState], float | None]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", lambda g: g.util_pct),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", lambda g: g.gr_active),
    ("DCGM_FI_DEV_FB_USED", lambda g: g.fb_used_mib),
    ("DCGM_FI_DEV_FB_FREE", lambda g: g.fb_free_mib),
    ("DCGM_FI_DEV_FB_RESERVED", lambda g: g.memory_reserved_mib),
    ("DCGM_FI_DEV_FB_TOTAL", lambda g: g.memory_total_mib if g.fb_total else None),
)
_DCGM_MIG_METRICS: tuple[tuple[str, Callable[[MigInstanceState], float | None]], ...] = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", lambda i: i.gr_engine_active),
    ("DCGM_FI_DEV_FB_USED", lambda i: i.fb_used_mib if i.fb_metrics else None),
    ("DCGM_FI_DEV_FB_FREE", lambda i: i.memory_total_mib - i.fb_used_mib if i.fb_metrics else None),
)
# dcgm-exporter's per-process (per-PID, summed per pod) values: SM % and MiB.
_DCGM_PER_PROCESS_METRICS: tuple[tuple[str, Callable[[PodOnGpu], float]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", lambda p: p.util_pct),
    ("DCGM_FI_DEV_FB_USED", lambda p: p.memory_used_mib),
)


def _dcgm_gpu_labels(
    gpu: GpuState, hostname_label: HostnameLabel, driver_version: str | None
) -> list[tuple[str, str]]:
    labels = [
        ("gpu", str(gpu.index)),
        ("UUID", gpu.uuid),
        ("pci_bus_id", gpu.bus_id),
        ("device", gpu.device),
        ("modelName", gpu.model),
        (hostname_label, gpu.node),
    ]
    if driver_version is not None:
        labels.append(("DCGM_FI_DRIVER_VERSION", driver_version))
    return labels


def _dcgm_pod_labels(pod: PodOnGpu | None, use_old_namespace: bool) -> list[tuple[str, str]]:
    names = (
        ("container_name", "pod_namespace", "pod_name")
        if use_old_namespace
        else ("container", "namespace", "pod")
    )
    values = ("", "", "") if pod is None else (pod.container, pod.namespace, pod.pod)
    return list(zip(names, values, strict=True))


def dcgm_device_metrics(
    gpus: Iterable[GpuState],
    *,
    hostname_label: HostnameLabel = "Hostname",
    use_old_namespace: bool = False,
    virtual_gpus: bool = False,
    driver_version: str | None = None,
) -> Exposition:
    """dcgm-exporter device series (``-k``: Kubernetes pod mapping on).

    Without ``virtual_gpus`` each GPU has one series per metric, labelled with the first pod on
    it (dcgm-exporter labels only one pod of a shared GPU) or with empty pod labels when idle.
    With ``virtual_gpus`` (``--kubernetes-virtual-gpus``) each sharing pod gets its own copy
    with a ``vgpu`` label and the same *device* value; an idle GPU keeps one unlabelled series.
    ``hostname_label`` is ``Hostname`` (tags up to 4.5.3-4.8.2) or ``hostname`` (main since
    2026-05-12).
    """
    out = Exposition()
    gpus = list(gpus)
    for name, read in _DCGM_DEVICE_METRICS:
        for gpu in gpus:
            base = _dcgm_gpu_labels(gpu, hostname_label, driver_version)
            if gpu.mig:
                _add_mig_series(out, name, gpu, base, use_old_namespace)
                continue
            value = read(gpu)
            if value is None:
                continue
            if virtual_gpus and gpu.pods:
                for i, pod in enumerate(gpu.pods):
                    labels = [*base, *_dcgm_pod_labels(pod, use_old_namespace)]
                    labels.append(("vgpu", pod.vgpu if pod.vgpu is not None else str(i)))
                    out.add(name, labels, value)
            else:
                first = gpu.pods[0] if gpu.pods else None
                out.add(name, [*base, *_dcgm_pod_labels(first, use_old_namespace)], value)
    return out


def _add_mig_series(
    out: Exposition,
    name: str,
    gpu: GpuState,
    base: list[tuple[str, str]],
    use_old_namespace: bool,
) -> None:
    read = dict(_DCGM_MIG_METRICS).get(name)
    if read is None:
        return
    at = [k for k, _ in base].index("modelName") + 1
    for instance in gpu.mig:
        value = read(instance)
        if value is None:
            continue
        mig = [("GPU_I_PROFILE", instance.profile), ("GPU_I_ID", str(instance.instance_id))]
        labels = [*base[:at], *mig, *base[at:], *_dcgm_pod_labels(instance.pod, use_old_namespace)]
        out.add(name, labels, value)


def dcgm_per_process_metrics(
    gpus: Iterable[GpuState],
    *,
    hostname_label: HostnameLabel = "Hostname",
    use_old_namespace: bool = False,
    driver_version: str | None = None,
) -> Exposition:
    """dcgm-exporter's per-process series (virtual GPUs on): ``DCGM_FI_DEV_GPU_UTIL`` (pod's
    SM %) and ``DCGM_FI_DEV_FB_USED`` (pod's MiB), one per pod sharing the GPU, with the device
    labels plus pod labels, ``pod_uid`` and ``vgpu``. Serve them next to
    :func:`dcgm_device_metrics` (``virtual_gpus=True``), or use :func:`dcgm_metrics`."""
    out = Exposition()
    gpus = list(gpus)
    for name, read in _DCGM_PER_PROCESS_METRICS:
        for gpu in gpus:
            base = _dcgm_gpu_labels(gpu, hostname_label, driver_version)
            for i, pod in enumerate(gpu.pods):
                labels = [*base, *_dcgm_pod_labels(pod, use_old_namespace)]
                labels.append(("pod_uid", pod.uid))
                labels.append(("vgpu", pod.vgpu if pod.vgpu is not None else str(i)))
                out.add(name, labels, read(pod))
    return out


def dcgm_metrics(
    gpus: Iterable[GpuState],
    *,
    per_process: bool = False,
    hostname_label: HostnameLabel = "Hostname",
    use_old_namespace: bool = False,
    driver_version: str | None = None,
) -> Exposition:
    """What one dcgm-exporter serves: device series, and with ``per_process`` (virtual GPUs)
    the fanned-out device series plus the per-process series, grouped per metric family."""
    gpus = list(gpus)
    out = dcgm_device_metrics(
        gpus,
        hostname_label=hostname_label,
        use_old_namespace=use_old_namespace,
        virtual_gpus=per_process,
        driver_version=driver_version,
    )
    if per_process:
        out += dcgm_per_process_metrics(
            gpus,
            hostname_label=hostname_label,
            use_old_namespace=use_old_namespace,
            driver_version=driver_version,
        )
    return out


# ---- HAMi vGPUmonitor ----------------------------------------------------------------------------


def hami_metrics(
    gpus: Iterable[GpuState],
    *,
    names: HamiNames = "current",
    zone: str | None = "vGPU",
    legacy_host_nodeid: bool = True,
) -> Exposition:
    """HAMi vGPUmonitor (``:9394``) series.

    ``names``: ``current`` = v2.9+ names (``hami_*``); ``legacy`` = the names of <= v2.8 only;
    ``both`` = v2.9+ with ``--legacy-metrics=true``. Memory in bytes, utilisation 0-100. Per
    container the memory breakdown is rendered as all buffer (context = module = offset = 0).
    """
    gpus = list(gpus)
    current = names in ("current", "both")
    legacy = names in ("legacy", "both")
    zone_label = [("zone", zone)] if zone is not None else []
    out = Exposition()

    def host(gpu: GpuState, new_style: bool, with_node: bool = True) -> list[tuple[str, str]]:
        if new_style:
            labels = [("node", gpu.node)] if with_node else []
            labels += [
                ("device_index", str(gpu.index)),
                ("device_uuid", gpu.uuid),
                ("device_type", gpu.hami_device_type),
            ]
        else:
            labels = [("nodeid", gpu.node)] if legacy_host_nodeid else []
            labels += [
                ("deviceidx", str(gpu.index)),
                ("deviceuuid", gpu.uuid),
                ("devicetype", gpu.hami_device_type),
            ]
        return labels + zone_label

    def container(gpu: GpuState, pod: PodOnGpu, new_style: bool) -> list[tuple[str, str]]:
        keys = (
            ("namespace", "pod", "container", "vdevice_index", "device_uuid")
            if new_style
            else ("podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid")
        )
        values = (pod.namespace, pod.pod, pod.container, str(pod.vdevice_index), gpu.uuid)
        return [*zip(keys, values, strict=True), *zone_label]

    if current:
        for gpu in gpus:
            out.add("hami_host_gpu_memory_used_bytes", host(gpu, True), gpu.fb_used_mib * MIB)
        for gpu in gpus:
            out.add("hami_host_gpu_utilization_ratio", host(gpu, True), gpu.util_pct)
        for gpu in gpus:
            out.add(
                "hami_host_gpu_memory_controller_utilization_ratio",
                host(gpu, True, with_node=False),
                gpu.memory_util_pct,
            )
    if legacy:
        for gpu in gpus:
            out.add("HostGPUMemoryUsage", host(gpu, False), gpu.fb_used_mib * MIB)
        for gpu in gpus:
            out.add("HostCoreUtilization", host(gpu, False), gpu.util_pct)

    pods = [(gpu, pod) for gpu in gpus for pod in gpu.pods]
    if current:
        per_container: tuple[tuple[str, Callable[[GpuState, PodOnGpu], float]], ...] = (
            ("hami_vgpu_memory_used_bytes", lambda g, p: p.memory_used_bytes),
            ("hami_vgpu_memory_limit_bytes", lambda g, p: g.memory_limit_bytes(p)),
            ("hami_container_device_memory_bytes", lambda g, p: p.memory_used_bytes),
            ("hami_container_device_utilization_ratio", lambda g, p: p.util_pct),
            ("hami_vgpu_memory_context_bytes", lambda g, p: 0),
            ("hami_vgpu_memory_module_bytes", lambda g, p: 0),
            ("hami_vgpu_memory_buffer_bytes", lambda g, p: p.memory_used_bytes),
        )
        for name, read in per_container:
            for gpu, pod in pods:
                out.add(name, container(gpu, pod, True), read(gpu, pod))
        for gpu, pod in pods:
            if pod.last_kernel_seconds_ago is not None:
                out.add(
                    "hami_container_last_kernel_elapsed_seconds",
                    container(gpu, pod, True),
                    pod.last_kernel_seconds_ago,
                )
    if legacy:
        for gpu, pod in pods:
            out.add(
                "vGPU_device_memory_usage_in_bytes",
                container(gpu, pod, False),
                pod.memory_used_bytes,
            )
        for gpu, pod in pods:
            out.add(
                "vGPU_device_memory_limit_in_bytes",
                container(gpu, pod, False),
                gpu.memory_limit_bytes(pod),
            )
        for gpu, pod in pods:
            labels = container(gpu, pod, False)
            labels[5:5] = [
                ("context", "0"),
                ("module", "0"),
                ("data", str(pod.memory_used_bytes)),
                ("offset", "0"),
            ]
            out.add("Device_memory_desc_of_container", labels, pod.memory_used_bytes)
        for gpu, pod in pods:
            out.add(
                "Device_utilization_desc_of_container", container(gpu, pod, False), pod.util_pct
            )
        for gpu, pod in pods:
            if pod.last_kernel_seconds_ago is not None:
                out.add(
                    "Device_last_kernel_of_container",
                    container(gpu, pod, False),
                    pod.last_kernel_seconds_ago,
                )
    return out


def hami_scheduler_metrics(gpus: Iterable[GpuState], *, names: HamiNames = "current") -> Exposition:
    """HAMi scheduler (``:9395``) per-device memory series (``cmd/scheduler/metrics.go`` at
    4707fb02): the registered memory (``Totalmem`` MiB) in bytes, labelled
    ``node, device_uuid, device_index, device_type`` (legacy: ``GPUDeviceMemoryLimit`` with
    ``nodeid, deviceuuid, deviceidx, devicetype``). No ``zone`` label: not vGPUmonitor's."""
    out = Exposition()
    for gpu in gpus:
        values = (gpu.node, gpu.uuid, str(gpu.index), gpu.hami_device_type)
        if names in ("current", "both"):
            keys = ("node", "device_uuid", "device_index", "device_type")
            labels = list(zip(keys, values, strict=True))
            out.add("hami_gpu_memory_limit_bytes", labels, gpu.memory_total_mib * MIB)
        if names in ("legacy", "both"):
            keys = ("nodeid", "deviceuuid", "deviceidx", "devicetype")
            labels = list(zip(keys, values, strict=True))
            out.add("GPUDeviceMemoryLimit", labels, gpu.memory_total_mib * MIB)
    return out


def hami_node_register(gpus: Iterable[GpuState], *, legacy: bool = False) -> str:
    """The node annotation ``hami.io/node-nvidia-register`` for these GPUs.

    Current HAMi (``MarshalNodeDevices`` in ``pkg/device/devices.go`` at 4707fb02) writes a JSON
    array of ``DeviceInfo`` (fields in struct order, zero values omitted):
    ``[{"id":"GPU-…","count":10,"devmem":81920,"devcore":100,"type":"NVIDIA-…","mode":
    "hami-core","health":true}]``; ``legacy`` gives the older
    ``UUID,count,memMiB,cores,type,numa,health,index,mode:`` per device (``EncodeNodeDevices``).
    """
    gpus = list(gpus)
    if legacy:
        return "".join(
            f"{g.uuid},10,{g.memory_total_mib},100,{g.hami_device_type},0,true,{g.index},hami-core:"
            for g in gpus
        )
    entries = []
    for g in gpus:
        entry: dict[str, object] = {"id": g.uuid}
        if g.index:
            entry["index"] = g.index
        entry |= {
            "count": 10,
            "devmem": g.memory_total_mib,
            "devcore": 100,
            "type": g.hami_device_type,
            "mode": "hami-core",
            "health": True,
        }
        entries.append(entry)
    return json.dumps(entries, separators=(",", ":"))


# ---- vLLM ---------------------------------------------------------------------------------------


def _vllm_samples(
    pod: PodOnGpu,
    state: VllmState,
    *,
    kv_cache_metric: KvCacheMetric,
    pod_labels: bool,
    engine: str | None,
) -> Exposition:
    labels = [("model_name", state.model_name)]
    if engine is not None:
        labels.append(("engine", engine))
    if pod_labels:
        labels += [("namespace", pod.namespace), ("pod", pod.pod), ("container", pod.container)]
    out = Exposition()
    if kv_cache_metric in ("gpu_cache_usage_perc", "both"):
        out.add("vllm:gpu_cache_usage_perc", labels, state.kv_cache_usage)
    if kv_cache_metric in ("kv_cache_usage_perc", "both"):
        out.add("vllm:kv_cache_usage_perc", labels, state.kv_cache_usage)
    out.add("vllm:num_requests_waiting", labels, state.num_requests_waiting)
    out.add("vllm:num_requests_running", labels, state.num_requests_running)
    out.add("vllm:num_preemptions_total", labels, state.num_preemptions)
    return out


def vllm_metrics(
    gpus: Iterable[GpuState],
    *,
    kv_cache_metric: KvCacheMetric = "kv_cache_usage_perc",
    pod_labels: bool = True,
    engine: str | None = "0",
) -> Exposition:
    """vLLM server metrics of every pod with a ``vllm`` state, on one endpoint.

    ``kv_cache_metric``: ``vllm:kv_cache_usage_perc`` (newer vLLM), ``vllm:gpu_cache_usage_perc``
    (older) or both. ``engine=None`` drops the V1 ``engine`` label. A pod on several GPUs is
    rendered once.
    """
    out = Exposition()
    seen: set[tuple[str, str, str]] = set()
    for gpu in gpus:
        for pod in gpu.pods:
            key = (pod.namespace, pod.pod, pod.container)
            if pod.vllm is None or key in seen:
                continue
            seen.add(key)
            out += _vllm_samples(
                pod, pod.vllm, kv_cache_metric=kv_cache_metric, pod_labels=pod_labels, engine=engine
            )
    return out


def vllm_metrics_for_pod(
    pod: PodOnGpu,
    *,
    kv_cache_metric: KvCacheMetric = "kv_cache_usage_perc",
    engine: str | None = "0",
) -> Exposition:
    """One vLLM server's own metrics (no pod labels), for a per-pod scrape target whose
    static labels carry ``namespace``/``pod`` as a PodMonitor would."""
    if pod.vllm is None:
        raise ValueError(f"{pod.namespace}/{pod.pod} has no vllm state")
    return _vllm_samples(
        pod, pod.vllm, kv_cache_metric=kv_cache_metric, pod_labels=False, engine=engine
    )


# ---- the HTTP exporter ---------------------------------------------------------------------------


@dataclass
class _Endpoint:
    body: bytes = b""
    status: int = 200
    delay: float = 0.0
    scrapes: int = 0
    scrape_times: list[float] = field(default_factory=list)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    exporter: GpuTestExporter


class _Handler(QuietHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        status, body, delay = self.server.exporter._serve(path)
        if delay:
            time.sleep(delay)
        self.answer(status, body, CONTENT_TYPE if status == 200 else "text/plain")


class GpuTestExporter(ServingThread):
    """A threaded HTTP server on a free loopback port serving metrics text per path.

    ``set_metrics(text_or_exposition, path="/metrics")`` replaces what ``path`` serves; several
    paths let one exporter stand in for several exporters (one scrape job each). Unknown paths
    answer 404; :meth:`fail` makes a path answer an error (the target goes ``up == 0``).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._endpoints: dict[str, _Endpoint] = {}
        self._cond = threading.Condition(self._lock)
        self._server = _Server((host, port), _Handler)
        self._server.exporter = self
        self.host = host
        self.port = int(self._server.server_address[1])
        super().__init__(self._server, f"gpu-test-exporter-{self.port}", 0.1)

    @property
    def address(self) -> str:
        """``host:port`` for a scrape target."""
        return f"{self.host}:{self.port}"

    def url(self, path: str = "/metrics") -> str:
        return f"http://{self.address}{path}"

    def _serve(self, path: str) -> tuple[int, bytes, float]:
        with self._cond:
            endpoint = self._endpoints.get(path)
            if endpoint is None:
                return 404, b"not found\n", 0.0
            endpoint.scrapes += 1
            endpoint.scrape_times.append(time.time())
            self._cond.notify_all()
            if endpoint.status != 200:
                return endpoint.status, b"failing on purpose\n", endpoint.delay
            return 200, endpoint.body, endpoint.delay

    def set_metrics(self, metrics: str | Exposition, path: str = "/metrics") -> None:
        """Serve ``metrics`` (exposition text or an :class:`Exposition`) at ``path``, with 200."""
        text = metrics.text() if isinstance(metrics, Exposition) else metrics
        with self._cond:
            endpoint = self._endpoints.setdefault(path, _Endpoint())
            endpoint.body = text.encode()
            endpoint.status = 200

    def set_gpus(
        self,
        gpus: Iterable[GpuState],
        *,
        path: str = "/metrics",
        render: Callable[[Sequence[GpuState]], Exposition] | None = None,
    ) -> Exposition:
        """Serve a model: by default dcgm device + HAMi v2.9+ + vLLM; returns what is served."""
        gpus = list(gpus)
        exposition = (
            render(gpus)
            if render is not None
            else dcgm_metrics(gpus) + hami_metrics(gpus) + vllm_metrics(gpus)
        )
        self.set_metrics(exposition, path)
        return exposition

    def fail(self, path: str = "/metrics", status: int = 503) -> None:
        with self._cond:
            self._endpoints.setdefault(path, _Endpoint()).status = status

    def set_delay(self, seconds: float, path: str = "/metrics") -> None:
        """Answer ``path`` after ``seconds`` (beyond scrape_timeout: a timed-out scrape)."""
        with self._cond:
            self._endpoints.setdefault(path, _Endpoint()).delay = seconds

    def remove(self, path: str = "/metrics") -> None:
        with self._cond:
            self._endpoints.pop(path, None)

    def paths(self) -> list[str]:
        with self._cond:
            return list(self._endpoints)

    def scrape_count(self, path: str = "/metrics") -> int:
        with self._cond:
            endpoint = self._endpoints.get(path)
            return 0 if endpoint is None else endpoint.scrapes

    def wait_for_scrapes(self, count: int, path: str = "/metrics", timeout: float = 10.0) -> None:
        """Wait until ``path`` has been requested ``count`` more times from now."""
        deadline = time.monotonic() + timeout
        with self._cond:
            endpoint = self._endpoints.get(path)
            target = (endpoint.scrapes if endpoint else 0) + count
            while True:
                endpoint = self._endpoints.get(path)
                if endpoint is not None and endpoint.scrapes >= target:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{path}: fewer than {count} scrapes within {timeout}s")
                self._cond.wait(remaining)
