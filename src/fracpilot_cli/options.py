"""Global options: accepted before the command and after it, at every level.

``fracpilot -o json status`` and ``fracpilot status -o json`` are the same, and so are
``fracpilot -n inference policy get``, ``fracpilot policy -n inference get`` and
``fracpilot policy get -n inference``. Each option is declared on the root callback and on
every command (and group callback) that uses it, by :func:`takes`, so each ``--help`` lists
it under "Global options"; wherever it is given, its value goes into the context's ``meta``,
which a command and all its parents share, and the innermost one given wins. A command reads
them with :func:`given`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import Annotated, Any, TypeVar

import typer

PANEL = "Global options"
_META = "fracpilot.global_options"
_PREFIX = "global_option_"  # the wrapper's parameter names: global_option_<name>
_CTX = "global_options_context"
_via_kubeconfig = False  # set by the kubectl-fracpilot entry point
_current: ContextVar[GlobalOptions | None] = ContextVar("fracpilot_global_options", default=None)
F = TypeVar("F", bound=Callable[..., Any])


class OptionsError(ValueError):
    """Global options that do not go together."""


def set_via_kubeconfig(on: bool) -> None:
    """Reach NATS through the kubeconfig by default (``kubectl fracpilot``)."""
    global _via_kubeconfig
    _via_kubeconfig = on


@dataclass(frozen=True)
class GlobalOptions:
    """What was given on the command line (None: not given)."""

    output: str | None = None
    as_json: bool = False
    nats_url: str | None = None
    namespace: str | None = None
    all_namespaces: bool = False
    kubeconfig: str | None = None
    context: str | None = None
    release: str | None = None
    release_namespace: str | None = None

    @property
    def kube(self) -> bool:
        """Reach NATS through the kubeconfig: a kubeconfig option is given, or this is
        ``kubectl fracpilot`` without ``--nats-url``."""
        asked = any((self.kubeconfig, self.context, self.release, self.release_namespace))
        return asked or (_via_kubeconfig and not self.nats_url)

    def check(self) -> None:
        """--nats-url and the kubeconfig options are two ways to NATS: one at a time."""
        if self.nats_url and any(
            (self.kubeconfig, self.context, self.release, self.release_namespace)
        ):
            raise OptionsError(
                "--nats-url goes straight to NATS; --kubeconfig, --context, --release and "
                "--release-namespace go through Kubernetes: give one or the other"
            )

    def namespaces(self) -> str | None:
        """The namespace a listing is narrowed to (None: every namespace), as kubectl: -n one
        namespace, -A every one; neither: through the kubeconfig (``kubectl fracpilot``, or a
        kubeconfig option), the context's namespace, else ``default``; straight to NATS
        (``--nats-url``, no context), every namespace (docs/cli.md)."""
        if self.all_namespaces and self.namespace:
            raise OptionsError("-n and -A: give one or the other")
        if self.all_namespaces:
            return None
        if self.namespace or not self.kube:
            return self.namespace
        from fracpilot_cli.kube_access import context_namespace

        return context_namespace(self.kubeconfig, self.context)

    def format(self) -> str | None:
        """``-o``, with ``--json`` as its alias; both given and different: an error."""
        if self.as_json and self.output not in (None, "json"):
            raise OptionsError(f"--json is -o json: it cannot go with -o {self.output}")
        return "json" if self.as_json else self.output


# name -> (declarations, is a flag, metavar, help)
_OPTIONS: dict[str, tuple[list[str], bool, str | None, str]] = {
    "output": (
        ["-o", "--output"],
        False,
        "table|wide|json|yaml|csv",
        "Output format (each command's --help says which it prints and its default).",
    ),
    "as_json": (["--json"], True, None, "The same as -o json."),
    "nats_url": (
        ["--nats-url"],
        False,
        "URL",
        "NATS server URL(s), comma-separated (default: FRACPILOT_NATS_URL, else "
        "nats://127.0.0.1:4222).",
    ),
    "namespace": (["-n", "--namespace"], False, "NAMESPACE", "Only this namespace's workloads."),
    "all_namespaces": (
        ["-A", "--all-namespaces"],
        True,
        None,
        "Every namespace's workloads (the default without -n; recommend: the context's).",
    ),
    "kubeconfig": (
        ["--kubeconfig"],
        False,
        "PATH",
        "Reach NATS through this kubeconfig (a port forward to the release's NATS with its "
        "credentials); kubectl fracpilot does so by default (KUBECONFIG, else ~/.kube/config).",
    ),
    "context": (["--context"], False, "NAME", "The kubeconfig context to use."),
    "release": (
        ["--release"],
        False,
        "NAME",
        "The Helm release of fracpilot (default: the only one in the release namespace).",
    ),
    "release_namespace": (
        ["--release-namespace"],
        False,
        "NAMESPACE",
        "Where the release runs (default: the context's namespace, then fracpilot).",
    ),
}

# the options that take a value (the others are flags), for a scan of argv before parsing
VALUE_FLAGS = frozenset(d for decls, flag, _, _ in _OPTIONS.values() if not flag for d in decls)
OUTPUT = ("output", "as_json")
CONNECTION = ("nats_url", "kubeconfig", "context", "release", "release_namespace")
READER = (*OUTPUT, *CONNECTION, "namespace", "all_namespaces")
ALL = tuple(_OPTIONS)


def _parameter(name: str) -> inspect.Parameter:
    decls, flag, metavar, text = _OPTIONS[name]
    option = typer.Option(
        *decls,
        metavar=metavar,
        help=text,
        show_default=False,
        rich_help_panel=PANEL,
    )
    kind: Any = bool if flag else str | None
    return inspect.Parameter(
        _PREFIX + name,
        inspect.Parameter.KEYWORD_ONLY,
        default=False if flag else None,
        annotation=Annotated[kind, option],
    )


def takes(names: Iterable[str]) -> Callable[[F], F]:
    """Declare the global options ``names`` on a command or group callback: they are kept
    (when given) for :func:`given`, and not passed to the function."""
    wanted = tuple(names)

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn, eval_str=True)
        own = list(signature.parameters.values())
        # typer passes the context to one parameter: the function's own, if it has one
        has_ctx = next((p.name for p in own if p.annotation is typer.Context), None)
        extra = [_parameter(n) for n in wanted]
        if has_ctx is None:
            extra.append(
                inspect.Parameter(_CTX, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
            )

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx: typer.Context = kwargs[has_ctx] if has_ctx else kwargs.pop(_CTX)
            kept = ctx.meta.setdefault(_META, {})
            for name in wanted:
                value = kwargs.pop(_PREFIX + name)
                if value not in (None, False):
                    kept[name] = value
            token = _current.set(GlobalOptions(**kept))
            try:
                return fn(*args, **kwargs)
            finally:
                _current.reset(token)

        wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*own, *extra]
        )
        wrapper.__annotations__ = {}  # typer reads the signature above
        return wrapper  # type: ignore[return-value]

    return decorate


def given() -> GlobalOptions:
    """The global options given on the command line, in a command :func:`takes` wraps."""
    return _current.get() or GlobalOptions()


NAMES = tuple(f.name for f in fields(GlobalOptions))
