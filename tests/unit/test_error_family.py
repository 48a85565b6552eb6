"""One error family: every error core and the built-in plugins raise to a caller is an
``ArcticRLError``, each (status, code) pair is defined once, and ``docs/errors.md`` is the
generated table of them.

The rules, precisely:

- A class *defines* a (status, code) pair when its own body sets ``status`` or ``code``; the
  pair is then ``(cls.status, cls.code)``. No two classes define the same pair. A subclass
  that sets neither inherits its parent's pair: that is not a second definition (``except
  Parent`` catches it, and the table shows it under the parent's pair). Setting the very pair
  a class inherits counts as a definition, so it fails too.
- A *caller's mistake* is a class that is an ``InvalidRequestError``, ``NotFoundError`` or
  ``AuthError``, a ``ValueError`` (unless listed in ``SERVER_SIDE_VALUE_ERRORS`` with the
  reason), or whose code says bad input (starts with ``invalid_``, ``bad_`` or ``unknown_``,
  or ends with ``not_found``). A caller's mistake answers 4xx, never 5xx.
- Every class has its own docstring (its first paragraph is the table's meaning) and a
  ``remedy`` (own or inherited: what the caller should do).
- Every class in core or plugin sources that derives from ``BaseException`` (found with
  ``ast``, checked on the imported class) is an ``ArcticRLError``, unless ``NOT_IN_FAMILY``
  lists it with the reason.
- A plugin raises only family errors: a ``raise`` of a builtin exception in plugin sources
  fails unless it is in a pydantic validator (pydantic turns it into a ``ValidationError``,
  answered 422), an ``AssertionError`` (an invariant, never a caller's), or is listed in
  ``PLUGIN_RAISES`` with the reason. So ``except ArcticRLError`` catches every error a
  plugin raises to a caller.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from arctic_platform.rl import errors_doc
from arctic_platform.rl.errors import (
    ArcticRLError,
    AuthError,
    CheckpointNotFoundError,
    InvalidRequestError,
    JobNotFoundError,
    NotFoundError,
    RolledBackError,
)

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = (REPO / "core", *sorted({p.parent for p in (REPO / "plugins").glob("*/*/")}))
PLUGINS = REPO / "plugins"
BAD_INPUT_CODE = re.compile(r"^(invalid|bad|unknown)_|not_found$")

SERVER_SIDE_VALUE_ERRORS = {
    "JobLogError": "a damaged job-table log the server reads at start, not a caller's input; "
    "a ValueError so load_table's `except ValueError` names the file",
}
NOT_IN_FAMILY: dict[str, str] = {}  # "module.Class" -> why it is not an ArcticRLError
PLUGIN_RAISES = {
    ("transports/arctic_rl_http/app.py", "ValueError"): "build_app's own argument "
    "(max_request_bytes), checked when a server is built from code; never a request's",
    ("engines/arctic_rl_engines/vllm_worker_extension.py", "ValueError"): "runs inside a "
    "vLLM worker; the engine turns a failed worker call into EngineError (vllm_common)",
    ("engines/arctic_rl_engines/vllm_worker_extension.py", "RuntimeError"): "runs inside a "
    "vLLM worker; the engine turns a failed worker call into EngineError (vllm_common)",
    ("transports/arctic_rl_tinker/losses.py", "NotImplementedError"): "an abstract method "
    "every Tinker loss overrides",
    ("demo/arctic_rl_demo/settings.py", "ValueError"): "the demo application's own settings "
    "(those every task shares), checked by its command before it starts",
    ("demo/arctic_rl_demo/heldout.py", "ValueError"): "the demo application's own task "
    "settings (key length, held-out size), checked before it starts",
    ("demo/arctic_rl_demo/tasks/reverse/settings.py", "ValueError"): "the demo application's "
    "own settings, checked by its command before it starts",
    ("demo/arctic_rl_demo/tasks/reverse/settings.py", "SystemExit"): "the demo command "
    "refusing a flag the reverse task does not take: it ends the command line, nothing "
    "catches it",
    ("demo/arctic_rl_demo/tasks/reverse/task.py", "ValueError"): "the demo application's own "
    "task settings, checked before it starts",
    ("demo/arctic_rl_demo/tasks/lookup/settings.py", "SystemExit"): "the demo command refusing "
    "flags the lookup task does not take: it ends the command line, nothing catches it",
    ("demo/arctic_rl_demo/tasks/lookup/agent.py", "ValueError"): "the lookup demo's own check "
    "of its session handle (a client raising to itself)",
    ("demo/arctic_rl_demo/tasks/lookup/grpo.py", "ValueError"): "the lookup demo's own check "
    "of the rows it built (a client raising to itself)",
    ("demo/arctic_rl_demo/tasks/lookup/settings.py", "ValueError"): "the lookup demo's own "
    "settings, checked before it starts",
    ("demo/arctic_rl_demo/tasks/lookup/run.py", "RuntimeError"): "the lookup demo's own check "
    "that a session's prompt matches its demonstrations (a client raising to itself)",
    ("demo/arctic_rl_demo/tasks/lookup/sft.py", "ValueError"): "the lookup demo's own check of "
    "its demonstrations' rendering",
}
CORE_RAISES = {
    ("arctic_platform/rl/observe/deferred_metrics.py", "ValueError"): "ray.util.metrics' own "
    "answer to a record whose tags its metric does not declare, kept by the stand-in vLLM's "
    "stat logger records through: a bug of the recording code, never a caller's input",
    ("arctic_platform/rl/observe/recorder.py", "ValueError"): "a metric recorded with labels "
    "its family does not declare: a bug of ours (the labels are written in core and plugins), "
    "never a caller's input",
    ("arctic_platform/rl/__init__.py", "AttributeError"): "the package's lazy __getattr__: "
    "Python's protocol for a missing module attribute",
    ("arctic_platform/rl/lazy_names.py", "AttributeError"): "a lazy module __getattr__: "
    "Python's protocol for a missing module attribute",
    ("arctic_platform/rl/agents/chat_tokenizer.py", "ValueError"): "a model without a chat "
    "template; the one caller (server/agent_ops.py) answers it as InvalidRequestError",
    ("arctic_platform/rl/agents/history.py", "TypeError"): "messages reach it validated "
    "(dicts or pydantic models): anything else is a bug of ours, not a caller's input",
    ("arctic_platform/rl/agents/journal.py", "ValueError"): "a session id the server made "
    "itself (hex); the guard keeps a file path from ever coming from elsewhere",
    ("arctic_platform/rl/config.py", "ValueError"): "in a pydantic field's check "
    "(_registered): pydantic answers it as a ValidationError naming the field",
    ("arctic_platform/rl/network.py", "OSError"): "no free ports on a node (the machine's "
    "own resources): raised in a worker call the server makes, never on a request's input",
    ("arctic_platform/rl/losses.py", "NotImplementedError"): "an abstract method every "
    "built-in loss overrides",
    ("arctic_platform/rl/plugins/registry.py", "TypeError"): "a plugin yielding the wrong "
    "spec type: the plugin author's bug, raised while plugins load",
    ("arctic_platform/rl/server/job_log.py", "ValueError"): "caught on the next line "
    "(a damaged log line is skipped and named)",
    ("arctic_platform/rl/server/log_rotation.py", "ValueError"): "the server's own log "
    "settings, checked when it starts",
    ("arctic_platform/rl/server/process.py", "SystemExit"): "a signal ends the serve "
    "process: nothing catches it",
    ("arctic_platform/rl/server/ray_cluster.py", "ValueError"): "a Ray address given to "
    "the serve command (or RAY_ADDRESS) at the server's own start, never a request's",
    ("arctic_platform/rl/server/worker.py", "ValueError"): "inside a Ray worker, for a "
    "method the server itself chose; the server turns a failed worker call into EngineError",
    ("arctic_platform/rl/server/worker.py", "RuntimeError"): "inside a Ray worker before its "
    "engine is set up; the server turns a failed worker call into EngineError",
    ("arctic_platform/rl/server/worker_launch.py", "TimeoutError"): "inside the launch "
    "thread; a job that cannot be placed ends failed with this reason (job_state)",
    ("arctic_platform/rl/testing.py", "ValueError"): "the test kit's own arguments "
    "(build_tiny_model), called from code, never by a request",
    ("arctic_platform/rl/weight_sync/buckets.py", "ValueError"): "the bucket size the "
    "server's own config fixed; never a request's",
    ("arctic_platform/rl/weight_sync/coordinator.py", "TimeoutError"): "a sender waiting "
    "for its receiver's listener inside a worker; the sync operation answers it as a failed "
    "sync (weight_sync_failed)",
    ("arctic_platform/rl/wire/requests.py", "ValueError"): "in a pydantic field's check: "
    "answered as a ValidationError (422) naming the field",
}
"""Builtin exceptions core raises, each with why no caller meets it as such."""
VALIDATORS = {"field_validator", "model_validator", "validator", "root_validator"}


@pytest.fixture(scope="module")
def classes() -> list[type[ArcticRLError]]:
    """Every error class of core and the installed plugins (all their modules imported)."""
    return errors_doc.error_classes()


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_the_plugins_errors_are_in_the_walk(classes: list[type[ArcticRLError]]) -> None:
    """The walk reaches every built-in plugin (a plugin missing here escapes every rule)."""
    packages = {cls.__module__.split(".")[0] for cls in classes}
    assert {"arctic_rl_dss", "arctic_rl_tinker", "arctic_rl_local"} <= packages
    assert len(classes) >= 40


def test_each_status_and_code_pair_is_defined_by_one_class(
    classes: list[type[ArcticRLError]],
) -> None:
    by_pair: dict[tuple[int, str], list[str]] = defaultdict(list)
    for cls in classes:
        if "status" in vars(cls) or "code" in vars(cls):
            by_pair[(cls.status, cls.code)].append(_name(cls))
    twice = {pair: names for pair, names in by_pair.items() if len(names) > 1}
    assert not twice, f"(status, code) pairs defined by more than one class: {twice}"


def test_statuses_are_http_errors_and_codes_are_snake_case(
    classes: list[type[ArcticRLError]],
) -> None:
    for cls in classes:
        assert isinstance(cls.status, int) and 400 <= cls.status <= 599, _name(cls)
        assert re.fullmatch(r"[a-z][a-z0-9_]*", cls.code), _name(cls)


def _callers_mistake(cls: type[ArcticRLError]) -> bool:
    if issubclass(cls, InvalidRequestError | NotFoundError | AuthError):
        return True
    if issubclass(cls, ValueError) and cls.__name__ not in SERVER_SIDE_VALUE_ERRORS:
        return True
    return bool(BAD_INPUT_CODE.search(cls.code))


def test_a_callers_mistake_never_answers_5xx(classes: list[type[ArcticRLError]]) -> None:
    wrong = [
        f"{_name(cls)} ({cls.status} {cls.code})"
        for cls in classes
        if _callers_mistake(cls) and cls.status >= 500
    ]
    assert not wrong, f"a caller's mistake with a 5xx status: {wrong}"


def test_every_error_class_says_what_it_means_and_what_to_do(
    classes: list[type[ArcticRLError]],
) -> None:
    for cls in classes:
        assert errors_doc.meaning(cls), f"{_name(cls)} has no docstring of its own"
        assert cls.remedy.strip(), f"{_name(cls)} has no remedy"


def _builtin_exception(name: str) -> bool:
    found = getattr(builtins, name, None)
    return isinstance(found, type) and issubclass(found, BaseException)


def _module_name(path: Path) -> str:
    root = next(r for r in SOURCE_ROOTS if r in path.parents)
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> list[Path]:
    return sorted(
        p for root in SOURCE_ROOTS for p in root.rglob("*.py") if "__pycache__" not in p.parts
    )


def test_every_exception_class_in_core_and_plugins_is_an_arctic_rl_error(
    classes: list[type[ArcticRLError]],
) -> None:
    """Found by ast (nested classes too), checked on the imported class."""
    outside = []
    for path in _sources():
        module = sys.modules.get(_module_name(path))
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {
                b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
            }
            exceptionish = any(
                b.endswith(("Error", "Exception", "Exit")) or _builtin_exception(b) for b in bases
            )
            cls = getattr(module, node.name, None) if module is not None else None
            if cls is None:
                if exceptionish:
                    outside.append(
                        f"{path.relative_to(REPO)}:{node.lineno} {node.name} (not found)"
                    )
                continue
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                continue
            if not issubclass(cls, ArcticRLError) and _name(cls) not in NOT_IN_FAMILY:
                outside.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert not outside, f"exception classes outside the ArcticRLError family: {outside}"


class _Raises(ast.NodeVisitor):
    """The builtin exceptions a module raises, outside pydantic validators."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self._in_validator = 0

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        names = set()
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            names.add(target.id if isinstance(target, ast.Name) else getattr(target, "attr", ""))
        validator = bool(names & VALIDATORS)
        self._in_validator += validator
        self.generic_visit(node)
        self._in_validator -= validator

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        name = exc.id if isinstance(exc, ast.Name) else ""
        if _builtin_exception(name) and name != "AssertionError" and not self._in_validator:
            self.found.append((node.lineno, name))


def test_plugins_raise_only_arctic_rl_errors_to_their_callers() -> None:
    raised = []
    for path in sorted(PLUGINS.rglob("*.py")):
        visitor = _Raises()
        visitor.visit(ast.parse(path.read_text()))
        where = path.relative_to(PLUGINS).as_posix()
        for line, name in visitor.found:
            if (where, name) not in PLUGIN_RAISES:
                raised.append(f"plugins/{where}:{line} raise {name}")
    assert not raised, (
        "a plugin raises a builtin exception (except ArcticRLError would miss it): raise a "
        f"core error (InvalidRequestError is a ValueError too) or list it with why: {raised}"
    )


def test_core_raises_only_arctic_rl_errors_to_its_callers() -> None:
    """The same scan over core: a public call (``open_session`` raised ``ValueError``) must
    raise a family error; the builtin raises left are listed with why no caller meets them."""
    core = REPO / "core"
    raised, seen = [], set()
    for path in sorted(core.rglob("*.py")):
        visitor = _Raises()
        visitor.visit(ast.parse(path.read_text()))
        where = path.relative_to(core).as_posix()
        for line, name in visitor.found:
            seen.add((where, name))
            if (where, name) not in CORE_RAISES:
                raised.append(f"core/{where}:{line} raise {name}")
    assert not raised, (
        "core raises a builtin exception to a caller: raise a family error or list it in "
        f"CORE_RAISES with why: {raised}"
    )
    assert not set(CORE_RAISES) - seen, f"stale CORE_RAISES: {set(CORE_RAISES) - seen}"


def test_one_missing_checkpoint_class_and_one_rolled_back_class() -> None:
    """The platform's names are core's classes, so except clauses agree whoever raised."""
    from arctic_rl_dss import errors as dss_errors

    assert dss_errors.CheckpointNotFoundError is CheckpointNotFoundError
    assert dss_errors.RolledBackRequestError is RolledBackError
    assert issubclass(CheckpointNotFoundError, NotFoundError)
    assert issubclass(JobNotFoundError, NotFoundError) and issubclass(JobNotFoundError, KeyError)
    assert (CheckpointNotFoundError.status, CheckpointNotFoundError.code) == (
        404,
        "checkpoint_not_found",
    )
    assert (RolledBackError.status, RolledBackError.code) == (409, "rolled_back")


def test_old_homes_still_export_the_moved_classes() -> None:
    from arctic_platform.rl import errors
    from arctic_platform.rl.batch import BatchError
    from arctic_platform.rl.http_common import BadRequestError, UnsupportedMediaTypeError
    from arctic_platform.rl.protocol import FrameError
    from arctic_platform.rl.server.job_log import JobLogError
    from arctic_platform.rl.server.job_table import JobTableError, RolledBackError
    from arctic_platform.rl.weight_sync import TopologyError, WeightMismatchError
    from arctic_platform.rl.weight_sync.pair_auth import StrayPeerError
    from arctic_rl_http.serve import ServeError as HttpServeError
    from arctic_rl_tinker.serve import ServeError as TinkerServeError

    for cls in (BatchError, BadRequestError, UnsupportedMediaTypeError, FrameError, JobLogError):
        assert getattr(errors, cls.__name__) is cls
    for cls in (JobTableError, RolledBackError, TopologyError, WeightMismatchError):
        assert getattr(errors, cls.__name__) is cls
    assert StrayPeerError is errors.StrayPeerError
    assert HttpServeError is TinkerServeError is errors.ServeError
    assert issubclass(JobLogError, ValueError)


def test_docs_errors_md_is_the_generated_table(classes: list[type[ArcticRLError]]) -> None:
    path = REPO / errors_doc.DOC_PATH
    expected = errors_doc.errors_markdown(classes)
    assert path.is_file() and path.read_text() == expected, (
        f"{errors_doc.DOC_PATH} is not the generated error table; regenerate it with "
        f"`{errors_doc.REGENERATE}`"
    )
