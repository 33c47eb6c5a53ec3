"""Failures of the JVM and of Spark's Python workers, converted once, here, into icelog's errors.

What py4j and pyspark raise says little by its type: py4j's `Py4JJavaError` wraps any Java exception, pyspark
turns a few into its own classes (AnalysisException, PythonException, ...) and leaves the rest to py4j. Every
Spark job and Iceberg Java call of icelog runs under `jvm_errors()` (the facade in iceberg_java.py, the jobs in
data_files.py and icelog.archive), which raises instead:

  - `CommitConflictError` (icelog.errors, retriable): Iceberg refused a commit for a concurrent one; found by the
    class chain of the Java exception and its causes (CommitFailedException, ValidationException);
  - `WorkerError`: a task failed in a Spark Python worker; retriable when the worker raised a retriable icelog
    error (the schema registry unavailable), else not (a batch that cannot be decoded: the dead-letter case);
  - `JvmError` (retriable): any other failure of the JVM or of Spark (the catalog or the warehouse unreachable, an
    executor lost, a table dropped meanwhile, the JVM gone). Deciding which of those would heal by itself needs
    more than the type says; all of them are retried with backoff, as they were before they had a type.

Errors of icelog's own pass through unchanged. The original exception stays the converted one's `__cause__`
(its Java stack trace is in the logs).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from icelog.errors import CommitConflictError, IcelogError, first_line

I = TypeVar("I")  # noqa: E741 - the item type of a task's input
T = TypeVar("T")

# Iceberg's exceptions of a commit that lost to a concurrent one (subclasses included)
CONFLICT_CLASSES = frozenset({
    "org.apache.iceberg.exceptions.CommitFailedException",
    "org.apache.iceberg.exceptions.ValidationException",
})
# What Spark raises on the driver for an exception of a Python worker (the worker's traceback as its message)
PYTHON_WORKER_CLASS = "org.apache.spark.api.python.PythonException"
# The line that `in_worker` makes a worker's failure end with (see _WorkerReport)
WORKER_REPORT_MARK = "icelog-worker-error: "
_MAX_CAUSES = 16  # a cause chain is walked this deep at most (Java allows cycles through suppressed causes)


class JvmError(IcelogError):
    """A failure of the JVM or of Spark icelog has no narrower type for; retried (see the module docstring)."""

    retriable = True

    def __init__(self, message: str, java_class: str = "") -> None:
        super().__init__(message)
        self.java_class = java_class  # the outermost Java exception's class ("" when the JVM did not answer)


class WorkerError(IcelogError):
    """A Spark task failed in a Python worker: `error_type` names what the worker raised ("" if unknown),
    `retriable` whether that was a retriable icelog error."""

    def __init__(self, error_type: str, message: str, retriable: bool) -> None:
        super().__init__(f"{error_type}: {message}" if error_type else message)
        self.error_type = error_type
        self.message = message
        self.retriable = retriable


class JavaClass(Protocol):
    """java.lang.Class."""

    def getName(self) -> str: ...
    def getSuperclass(self) -> JavaClass | None: ...


class JavaThrowable(Protocol):
    """java.lang.Throwable, as py4j hands it over."""

    def getClass(self) -> JavaClass: ...
    def getCause(self) -> JavaThrowable | None: ...
    def getMessage(self) -> str | None: ...
    def toString(self) -> str: ...


def class_names(throwable: JavaThrowable) -> list[str]:
    """The names of a Java exception's class and of its superclasses, its own first."""
    names = []
    cls: JavaClass | None = throwable.getClass()
    while cls is not None:
        names.append(str(cls.getName()))
        cls = cls.getSuperclass()
    return names


def causes(throwable: JavaThrowable) -> list[JavaThrowable]:
    """A Java exception and its causes, outermost first."""
    chain = [throwable]
    cause = throwable.getCause()
    while cause is not None and len(chain) < _MAX_CAUSES:
        chain.append(cause)
        cause = cause.getCause()
    return chain


def from_jvm(exc: BaseException) -> BaseException:
    """The icelog error for a py4j or pyspark exception (see the module docstring); any other exception as it is."""
    from py4j.protocol import Py4JError, Py4JJavaError
    from pyspark.errors import PySparkException, PythonException
    from pyspark.errors.exceptions.captured import CapturedException

    if isinstance(exc, IcelogError) or not isinstance(exc, Py4JError | PySparkException):
        return exc
    if isinstance(exc, PythonException):
        # A SQL job's Python function failed (mapInArrow): pyspark keeps only the worker's message, no Java object.
        return _worker_error(exc.desc if isinstance(exc, CapturedException) else str(exc))
    throwable: JavaThrowable | None = None
    if isinstance(exc, Py4JJavaError):
        throwable = exc.java_exception
    elif isinstance(exc, CapturedException):
        throwable = exc._origin  # the Java exception pyspark converted (pyspark has no public accessor)
    if throwable is None:  # the JVM did not answer (Py4JNetworkError), or a pyspark error of Python's own
        return JvmError(first_line(exc))
    for cause in causes(throwable):
        names = class_names(cause)
        if CONFLICT_CLASSES.intersection(names):
            return CommitConflictError(first_line(cause.toString()))
        if PYTHON_WORKER_CLASS in names:  # a job of Python workers (an RDD job) failed in one
            return _worker_error(str(cause.getMessage() or ""))
    return JvmError(first_line(throwable.toString()), str(throwable.getClass().getName()))


@contextlib.contextmanager
def jvm_errors() -> Iterator[None]:
    """Raise what fails inside as icelog's errors (from_jvm); also a decorator (`@jvm_errors()`)."""
    try:
        yield
    except Exception as exc:
        converted = from_jvm(exc)
        if converted is exc:
            raise
        raise converted from exc


class _WorkerReport(Exception):
    """What `in_worker`'s function raises in a Python worker for any failure of the task's code.

    Spark hands a worker's exception to the driver as its formatted traceback only (the message of Java's
    PythonException): no type crosses. So the report's message is one line, WORKER_REPORT_MARK and a JSON object
    (type, message, retriable), which `_worker_error` finds in that text: the one place icelog reads an exception's
    text, and only for a line it wrote itself.
    """


def in_worker(task: Callable[[I], Iterator[T]]) -> Callable[[I], Iterator[T]]:
    """A Spark task function (mapInArrow, mapPartitions) whose failures the driver sees as typed WorkerErrors."""

    def run(items: I) -> Iterator[T]:
        try:
            yield from task(items)
        except Exception as exc:
            report = {
                "type": type(exc).__name__,
                "message": str(exc)[:2000],
                "retriable": isinstance(exc, IcelogError) and exc.retriable,
            }
            raise _WorkerReport(WORKER_REPORT_MARK + json.dumps(report)) from exc

    return run


def _worker_error(text: str) -> WorkerError:
    """The WorkerError of a Python worker's failure, from the traceback text Spark carried (see _WorkerReport)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        _, mark, report = line.partition(WORKER_REPORT_MARK)
        if mark:
            try:
                found = json.loads(report)
                return WorkerError(str(found["type"]), str(found["message"]), bool(found["retriable"]))
            except (ValueError, KeyError, TypeError):
                break
    # Failed outside icelog's task code (pyspark's own worker code, the worker process died): no report. The last
    # line of a Python traceback names the exception; it is only shown, not decided on.
    return WorkerError("", lines[-1][:500] if lines else "a Python worker failed", retriable=False)
