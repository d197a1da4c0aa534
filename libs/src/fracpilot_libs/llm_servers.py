"""LLM servers that preallocate GPU memory: which one a container runs, what share of the card
its memory flag asks for, and the flag rewritten so that it allocates within a fraction. Pure.

Each server's flag, as its source defines it:

- **vLLM** ``--gpu-memory-utilization`` (``vllm/config/cache.py`` ``CacheConfig``, ``gt=0,
  le=1``; default 0.92 there, 0.90 in older ``vllm/engine/arg_utils.py`` ``EngineArgs``): a
  share of the card's *total* memory as CUDA reports it. The worker asks for
  ``total_memory * gpu_memory_utilization`` and refuses to start when less is free
  (``vllm/v1/worker/gpu_worker.py``: "Free memory on device ... is less than desired GPU
  memory utilization"). ``FlexibleArgumentParser`` also takes ``--gpu_memory_utilization``
  (the production-stack chart writes that form). No environment variable sets it.
  ``--kv-cache-memory-bytes`` sizes the pool directly and makes vLLM ignore the flag.
- **SGLang** ``--mem-fraction-static`` (``python/sglang/srt/server_args.py``: "the fraction of
  the memory used for static allocation (model weights and KV cache memory pool)"; default
  None, chosen by SGLang from the card's memory). The KV pool is what is left of
  ``mem_fraction_static`` times the memory *free before the weights load*
  (``model_runner.profile_max_num_token``: ``rest = available - total * (1 - fraction)``);
  activations and CUDA graphs come on top of it, so its margin is wider.
- **TGI** ``--cuda-memory-fraction`` or env ``CUDA_MEMORY_FRACTION`` (``launcher/src/main.rs``,
  clap ``long, env``, default 1.0: "the total visible memory multiplied by
  cuda-memory-fraction"); the shard calls ``torch.cuda.set_per_process_memory_fraction`` and
  leaves ``(1 - fraction) * total`` free (``server/text_generation_server/utils/
  import_utils.py`` ``get_cuda_free_memory``). clap reads the argument before the env.

"Total" is what CUDA reports inside the container: the whole card under KAI's fractions alone,
the container's limit wherever HAMi-core enforces one (HAMi's ``nvidia.com/gpumem``, and KAI with
its hamicore plugin, ``CUDA_DEVICE_MEMORY_LIMIT``). HAMi-core hooks ``cuMemGetInfo_v2`` to
return ``total = min(limit, physical)`` and ``free = total - usage``, and ``cuDeviceTotalMem_v2``
to return the limit (Project-HAMi/HAMi-core 8f3a89c67b037d8fdfe6c4cd4d8c4f0cd6504811:
``src/cuda/memory.c``, ``src/cuda/device.c``; ``HOOK_MEMINFO_ENABLE`` is on in ``build.sh``),
and hands its hooks to the CUDA runtime through ``cuGetProcAddress`` (``src/cuda/hook.c``).
Each server reads its total there:

- vLLM ``MemorySnapshot.measure``: ``free_memory, total_memory = torch.cuda.mem_get_info()``
  (``vllm/utils/mem_utils.py`` at a6d5c39009eb73797b276cc557ca9659c396ca14), the total the
  flag is a share of;
- SGLang ``get_available_gpu_memory``: ``torch.cuda.mem_get_info``'s free
  (``python/sglang/srt/utils/common.py`` at 4e75f4684b6b67cbb5a02b4106cf1b629d616dba), which
  HAMi-core makes ``limit - usage``;
- TGI ``get_cuda_free_memory``: ``mem_get_info``'s free and
  ``get_device_properties().total_memory`` (``server/text_generation_server/utils/
  import_utils.py`` at db931fcf42da018a3657580c64bf2720f167f9ab), and torch's per-process
  fraction is of ``cudaMemGetInfo``'s total. ``total_memory`` comes from the runtime's
  ``cudaGetDeviceProperties``, closed source: that it reaches the hooked
  ``cuDeviceTotalMem_v2`` is inferred, not read. Were it the whole card, TGI would keep
  ``(1 - fraction) x card`` back from a smaller limit: a smaller pool, never an overrun.

So the rewrite takes ``visible_share``, the share of the physical card that CUDA reports as
total, and keeps the server within the smaller of its fraction and that share, less its margin
(:func:`flag_value`).

Anything not read with certainty is left untouched with a reason (a :class:`FlagReading` or
:class:`FlagRewrite` with ``problem`` set, never an exception): a shell script that starts the
server, an abbreviated flag (argparse's prefix matching), a value that is not a number or is
out of range, the flag given twice with different values, an env value from a reference,
vLLM's ``--config`` file or ``--kv-cache-memory-bytes``, two servers in one pod.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any


class LlmServer(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    TGI = "tgi"


class Source(StrEnum):
    """Where a container's flag value comes from."""

    ARGS = "args"
    COMMAND = "command"
    ENV = "env"
    DEFAULT = "default"  # not set: the server's default applies


@dataclass(frozen=True)
class MemoryFlag:
    """One server's memory flag, as its source defines it."""

    server: LlmServer
    flag: str  # the canonical long flag
    spellings: tuple[str, ...]  # every spelling the server's parser takes for it
    env: str | None  # an environment variable the server reads for it
    default: float | None  # None: the server sizes itself (SGLang)
    margin: float  # share of the pod's fraction kept out of the flag's reach
    argparse: bool  # argparse matches unambiguous prefixes (``allow_abbrev``); clap does not


VLLM_FLAG = MemoryFlag(
    server=LlmServer.VLLM,
    flag="--gpu-memory-utilization",
    spellings=("--gpu-memory-utilization", "--gpu_memory_utilization"),
    env=None,
    default=0.92,  # 0.90 before CacheConfig moved to vllm/config/cache.py: the larger one
    margin=0.05,  # the CUDA context and allocations outside vLLM's profile
    argparse=True,
)
SGLANG_FLAG = MemoryFlag(
    server=LlmServer.SGLANG,
    flag="--mem-fraction-static",
    spellings=("--mem-fraction-static",),
    env=None,
    default=None,
    margin=0.15,  # weights + KV only: activations and CUDA graphs come on top
    argparse=True,
)
TGI_FLAG = MemoryFlag(
    server=LlmServer.TGI,
    flag="--cuda-memory-fraction",
    spellings=("--cuda-memory-fraction",),
    env="CUDA_MEMORY_FRACTION",
    default=1.0,
    margin=0.05,  # the CUDA context, outside torch's per-process fraction
    argparse=False,
)
FLAGS: Mapping[LlmServer, MemoryFlag] = {f.server: f for f in (VLLM_FLAG, SGLANG_FLAG, TGI_FLAG)}

_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash"})
_VLLM_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
_KV_BYTES = ("--kv-cache-memory-bytes", "--kv_cache_memory_bytes")


def _as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _strings(value: Any) -> list[str] | None:
    """A command or args list; None when it is not a list of strings."""
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _image_repository(image: str) -> str:
    """``docker.io/vllm/vllm-openai:v0.8.5@sha256:..`` -> ``docker.io/vllm/vllm-openai``."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def _server_in_words(words: Sequence[str]) -> LlmServer | None:
    """The server a command line starts, from its program and module names."""
    for i, word in enumerate(words):
        base = posixpath.basename(word)
        following = words[i + 1] if i + 1 < len(words) else ""
        if word in _VLLM_MODULES or (base == "vllm" and following == "serve"):
            return LlmServer.VLLM
        if word == "sglang.launch_server" or (base == "sglang" and following == "serve"):
            return LlmServer.SGLANG
        if base == "text-generation-launcher":
            return LlmServer.TGI
    return None


def _server_of_image(image: str) -> LlmServer | None:
    """A server started by the image's own entrypoint (no command in the pod)."""
    repository = _image_repository(image).lower()
    last = repository.rsplit("/", 1)[-1]
    if last in ("vllm-openai", "huggingfaceserver"):  # KServe's runs vLLM for LLMs
        return LlmServer.VLLM
    if last == "text-generation-inference":
        return LlmServer.TGI
    return None


@dataclass(frozen=True)
class FlagReading:
    """What one container's server asks for; ``problem`` says why it cannot be read."""

    server: LlmServer | None  # None: not a preallocating server this module knows
    container: int | None = None
    container_name: str = ""
    value: float | None = None  # the flag's value; None: unset (default) or unreadable
    source: Source | None = None
    where: tuple[str, int] | None = None  # ("args", 3): the token holding the value
    form: str = ""  # "--flag=v", "--flag v" or "env"
    problem: str = ""  # why the flag is left untouched; "" when it was read

    @property
    def readable(self) -> bool:
        return self.server is not None and not self.problem

    def asked_share(self, visible_share: float = 1.0) -> float | None:
        """The share of the physical card the server will preallocate (SGLang: weights and
        KV at most); None when unknown, or when SGLang sizes itself."""
        if not self.readable or self.server is None:
            return None
        value = self.value if self.value is not None else FLAGS[self.server].default
        return None if value is None else value * visible_share

    def asks_more_than(self, fraction: float, visible_share: float = 1.0) -> bool:
        """True when the server will take more than ``fraction`` of the card (a server that
        sizes itself is taken to size from the whole visible card)."""
        if not self.readable:
            return False
        asked = self.asked_share(visible_share)
        return (visible_share if asked is None else asked) > fraction + 1e-9


def _parse_value(text: str, flag: MemoryFlag) -> tuple[float | None, str]:
    try:
        value = float(text.strip())
    except ValueError:
        return None, f"{flag.flag} value {text!r} is not a number"
    if not math.isfinite(value) or not 0.0 < value <= 1.0:
        return None, f"{flag.flag} {text!r} is out of range (0, 1]"
    return value, ""


@dataclass(frozen=True)
class _Occurrence:
    section: str  # "args" or "command"
    index: int  # the token that holds the value
    form: str
    text: str


def _occurrences(
    section: str, words: Sequence[str], flag: MemoryFlag
) -> tuple[list[_Occurrence], str]:
    """Every place ``words`` sets the flag, or why they cannot be read."""
    found: list[_Occurrence] = []
    for i, word in enumerate(words):
        name, eq, text = word.partition("=")
        if name in flag.spellings:
            if eq:
                found.append(_Occurrence(section, i, "--flag=v", text))
            elif i + 1 < len(words):
                found.append(_Occurrence(section, i + 1, "--flag v", words[i + 1]))
            else:
                return [], f"{name} has no value"
        elif (
            flag.argparse
            and len(name) > 3
            and name.startswith("--")
            and any(s.startswith(name) for s in flag.spellings)
        ):
            return [], f"{word!r} is an abbreviation of {flag.flag} (argparse prefix match)"
    return found, ""


def read_container(container: Mapping[str, Any], index: int = 0) -> FlagReading:
    """Which server ``container`` runs and what its memory flag says."""
    name = str(container.get("name") or "")
    command, args = _strings(container.get("command")), _strings(container.get("args"))
    image = str(container.get("image") or "")
    if command is None or args is None:
        server = _server_of_image(image)
        if server is None:
            return FlagReading(None, index, name)
        return FlagReading(server, index, name, problem="command or args is not a list of strings")
    words = command + args
    server = _server_in_words(words)
    if server is None and not command:
        server = _server_of_image(image)
    shell = bool(command) and posixpath.basename(command[0]) in _SHELLS and "-c" in command
    if server is None and shell:
        script = " ".join(words[command.index("-c") + 1 :])
        server = _server_in_words(script.replace("\\\n", " ").split())
        if server is not None:
            return FlagReading(
                server, index, name, problem="the server is started by a shell script"
            )
    if server is None:
        return FlagReading(None, index, name)
    reading = FlagReading(server, index, name)
    if shell:
        return _with(reading, problem="the server is started by a shell script")
    flag = FLAGS[server]
    found: list[_Occurrence] = []
    for section, section_words in (("command", command), ("args", args)):
        occurrences, problem = _occurrences(section, section_words, flag)
        if problem:
            return _with(reading, problem=problem)
        found.extend(occurrences)
    if server is LlmServer.VLLM:
        if any(w.partition("=")[0] in _KV_BYTES for w in words):
            return _with(
                reading,
                problem="--kv-cache-memory-bytes sizes the KV pool: vLLM ignores "
                "--gpu-memory-utilization",
            )
        if any(w.partition("=")[0] == "--config" for w in words):
            return _with(reading, problem="a --config file may set gpu-memory-utilization")
        if posixpath.basename(_image_repository(image)) == "huggingfaceserver" and any(
            w in ("--backend=huggingface", "huggingface") for w in words
        ):
            return FlagReading(None, index, name)  # KServe's Hugging Face backend: no vLLM
    env_value, env_problem = _env_value(container, flag)
    if env_problem:
        return _with(reading, problem=env_problem)
    values = {o.text.strip() for o in found}
    if len(values) > 1:
        return _with(reading, problem=f"{flag.flag} is given {len(found)} times: {sorted(values)}")
    if found:
        value, problem = _parse_value(found[0].text, flag)
        if problem:
            return _with(reading, problem=problem)
        if env_value is not None and env_value[1] != value:
            return _with(
                reading,
                problem=f"{flag.flag} {found[0].text} and {flag.env}={env_value[2]!r} disagree",
            )
        last = found[-1]
        return _with(
            reading,
            value=value,
            source=Source(last.section),
            where=(last.section, last.index),
            form=last.form,
        )
    if env_value is not None:
        return _with(
            reading, value=env_value[1], source=Source.ENV, where=("env", env_value[0]), form="env"
        )
    return _with(reading, source=Source.DEFAULT)


def _with(reading: FlagReading, **changes: Any) -> FlagReading:
    return replace(reading, **changes)


def _env_value(
    container: Mapping[str, Any], flag: MemoryFlag
) -> tuple[tuple[int, float, str] | None, str]:
    """(index, value, text) of the flag's env variable, or why it cannot be read."""
    if flag.env is None:
        return None, ""
    env = container.get("env")
    entries = env if isinstance(env, list) else []
    hits = [(i, e) for i, e in enumerate(entries) if _as_mapping(e).get("name") == flag.env]
    if not hits:
        return None, ""
    if len(hits) > 1:
        return None, f"{flag.env} is set {len(hits)} times"
    i, entry = hits[0]
    if "valueFrom" in entry:
        return None, f"{flag.env} comes from valueFrom: its value is not in the pod"
    text = str(entry.get("value", ""))
    value, problem = _parse_value(text, flag)
    if problem or value is None:
        return None, problem.replace(flag.flag, flag.env)
    return (i, value, text), ""


def read_pod(spec: Mapping[str, Any]) -> FlagReading:
    """The preallocating server of a pod spec (``spec`` of a pod or a pod template)."""
    containers = spec.get("containers")
    listed = containers if isinstance(containers, list) else []
    readings = [read_container(_as_mapping(c), i) for i, c in enumerate(listed)]
    servers = [r for r in readings if r.server is not None]
    if not servers:
        return FlagReading(None)
    if len(servers) > 1:
        names = ", ".join(f"{r.container_name} ({r.server})" for r in servers)
        return _with(servers[0], problem=f"several preallocating servers in one pod: {names}")
    return servers[0]


def flag_value(server: LlmServer, fraction: float, visible_share: float = 1.0) -> float:
    """The flag value that keeps ``server`` within ``fraction`` of the physical card, with its
    margin, when CUDA reports ``visible_share`` of the card as the total (a HAMi-core limit
    below the fraction holds it to the limit instead: KAI's hundredths make 0.125 a 0.12
    limit). Rounded down to three places so that the server never gets more; 0 when nothing
    is left."""
    flag = FLAGS[server]
    held = fraction if fraction < visible_share else visible_share
    wanted = held * (1.0 - flag.margin) / visible_share
    return min(math.floor(wanted * 1000 + 1e-9) / 1000, 1.0)


def kai_hamicore_share(fraction: float) -> float:
    """The share of the card a KAI pod with a HAMi-core limit sees as CUDA's total: KAI's
    binder writes ``CUDA_DEVICE_MEMORY_LIMIT = int(card MiB x portion)`` with the portion
    formatted ``%.2f`` (kai-scheduler d5bc503a ``pkg/binder/plugins/hamicore/hami_core.go``,
    ``pkg/scheduler/cache/cache.go``), never below a hundredth here (a nonzero fraction)."""
    portion = float(f"{min(max(fraction, 0.0), 1.0):.2f}")
    return portion if portion > 0.0 else 0.01


def format_value(value: float) -> str:
    """``0.45`` -> ``"0.45"``, ``1.0`` -> ``"1"``: the shortest plain decimal."""
    return format(round(value, 3), "f").rstrip("0").rstrip(".") or "0"


@dataclass(frozen=True)
class FlagRewrite:
    """The container fields to write (whole new lists) so the server fits its fraction.

    ``changes`` maps ``args``, ``command`` or ``env`` to its new list; empty when nothing
    changes or ``problem`` says why the pod is left untouched.
    """

    reading: FlagReading
    value: str = ""  # the flag value written
    changes: Mapping[str, list[Any]] = field(default_factory=dict)
    problem: str = ""

    @property
    def applies(self) -> bool:
        return self.reading.server is not None and not self.problem


def rewrite_pod(
    spec: Mapping[str, Any], fraction: float, *, visible_share: float = 1.0
) -> FlagRewrite:
    """The rewrite of a pod spec's server flag for ``fraction`` of the physical card.

    A flag already set is rewritten where it is (its token, or its env entry); a flag not set
    is added: as ``--flag=v`` at the end of ``args`` (of ``command`` when the pod gives no
    args), or for TGI without a command line as the env variable (which beats ``envFrom``).
    """
    reading = read_pod(spec)
    if reading.server is None:
        return FlagRewrite(reading, problem="no preallocating LLM server")
    if reading.problem:
        return FlagRewrite(reading, problem=reading.problem)
    if not (0.0 < fraction <= 1.0) or not (0.0 < visible_share <= 1.0):
        return FlagRewrite(
            reading,
            problem=f"fraction {fraction!r} or visible share {visible_share!r} "
            "is out of range (0, 1]",
        )
    flag = FLAGS[reading.server]
    value = flag_value(reading.server, fraction, visible_share)
    if value <= 0.0:
        return FlagRewrite(reading, problem=f"fraction {fraction} leaves nothing after the margin")
    text = format_value(value)
    if reading.value is not None and math.isclose(reading.value, value, abs_tol=5e-4):
        return FlagRewrite(reading, value=text)
    containers = spec.get("containers")
    container = _as_mapping(
        containers[reading.container or 0] if isinstance(containers, list) else {}
    )
    changes: dict[str, list[Any]] = {}
    if reading.where is not None and reading.where[0] in ("args", "command"):
        section, index = reading.where
        words = list(container.get(section) or [])
        words[index] = (
            f"{words[index].partition('=')[0]}={text}" if reading.form == ("--flag=v") else text
        )
        changes[section] = words
    elif reading.where is not None:  # env
        env = [dict(e) for e in container.get("env") or []]
        env[reading.where[1]]["value"] = text
        changes["env"] = env
    else:
        command = list(container.get("command") or [])
        args = list(container.get("args") or [])
        if args or not command:
            if not args and not command and flag.env is None:
                return FlagRewrite(
                    reading, problem="no command line to add the flag to (the image's own)"
                )
            if not args and not command and flag.env is not None:
                env = [dict(e) for e in container.get("env") or []]
                env.append({"name": flag.env, "value": text})
                changes["env"] = env
            else:
                changes["args"] = [*args, f"{flag.flag}={text}"]
        else:
            changes["command"] = [*command, f"{flag.flag}={text}"]
    return FlagRewrite(reading, value=text, changes=changes)
