"""Secrets kept out of everything we print or write: one rule, one registry of secret values.

The rule (docs: 'Secrets'): a value is a secret when it came from a ``${env:…}``, ``${file:…}`` or
``${secret:…}`` reference in the configuration (:mod:`materializer.config.secrets` registers each
as it resolves it), when it is the value of an option whose key names a secret
(:data:`SECRET_KEY`: ``kafka.sasl.jaas.config``, ``sasl.password``, ``spark.hadoop.fs.s3a.secret.key``…),
or when it is the AWS secret key or session token of the environment. Text is redacted by
:func:`text`: every registered value becomes ``***``, and so do the secrets a pattern shows
whatever their origin (a URL's ``user:password@``, a Connect URL's ``;token=…``, ``password="…"``
in a JAAS line). Every output goes through it: the CLI's errors, results and ``--json``, Python
logging (:class:`LogFilter`), tracebacks (:func:`install`), the JVM's relayed output, event files,
Prometheus text, the drill's report.

A registered value shorter than :data:`MIN_LENGTH` is redacted only where it is a whole value (an
option's value, a JSON string): as a substring, ``on`` or ``1234`` would blank every word holding
it. Imports nothing of the package: every floor may use it.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from typing import Any, Iterable, Mapping

MASK = "***"
"""What a secret is replaced with."""

MIN_LENGTH = 6
"""Shortest registered value redacted inside longer text (shorter ones: as whole values only)."""

SECRET_KEY = re.compile(r"password|passwd|secret|token|jaas|credential|key", re.IGNORECASE)
"""An option key whose value is a secret: ``kafka.sasl.jaas.config``, ``sasl.password``,
``ssl.key.password``, ``spark.hadoop.fs.s3a.access.key``… (matched anywhere in the key)."""

ENVIRONMENT_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
"""Environment variables whose values are secrets wherever they show (boto3's and s3a's)."""

_PATTERNS = (
    # A URL's userinfo password: scheme://user:password@host
    (re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^/\s@]+@"), r"\1:" + MASK + "@"),
    # A Spark Connect URL's token parameter: sc://host:15002/;token=…
    (re.compile(r"(;\s*token\s*=\s*)[^;/\s'\"]+", re.IGNORECASE), r"\1" + MASK),
    # A JAAS line's secrets: password="…" (Kafka's sasl.jaas.config)
    (re.compile(r"((?:password|secret|token)\s*=\s*)(\"[^\"]*\"|'[^']*'|[^\s;\"']+)", re.IGNORECASE), r"\1" + MASK),
)

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def remember(value: str) -> None:
    """Register ``value`` as a secret: from now on :func:`text` replaces it with ``***``."""
    global _pattern
    if not isinstance(value, str) or not value.strip():
        return
    with _lock:
        if value in _secrets:
            return
        _secrets.add(value)
        long = sorted((s for s in _secrets if len(s) >= MIN_LENGTH), key=len, reverse=True)
        _pattern = re.compile("|".join(map(re.escape, long))) if long else None


def remember_options(options: Mapping[str, Any]) -> None:
    """Register the values of ``options`` whose keys name a secret (:data:`SECRET_KEY`), and the
    secrets that :func:`text`'s patterns find in the others."""
    for key, value in options.items():
        if not isinstance(value, str):
            continue
        if SECRET_KEY.search(str(key)):
            remember(value)
        else:
            remember_in(value)


def remember_in(value: str) -> None:
    """Register the secrets a pattern finds inside ``value`` (a URL's password, a Connect token), so
    they are redacted also where they show on their own."""
    for found in re.finditer(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:([^/\s@]+)@", value):
        remember(found.group(1))
    for found in re.finditer(r";\s*token\s*=\s*([^;/\s'\"]+)", value, re.IGNORECASE):
        remember(found.group(1))


def remember_environment(environ: Mapping[str, str] | None = None) -> None:
    """Register the AWS secrets of the environment (:data:`ENVIRONMENT_SECRETS`) and the password
    of an endpoint URL's userinfo."""
    env = os.environ if environ is None else environ
    for name in ENVIRONMENT_SECRETS:
        if env.get(name):
            remember(env[name])
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        if env.get(name):
            remember_in(env[name])


def forget_all() -> None:
    """Clear the registry (tests)."""
    global _pattern
    with _lock:
        _secrets.clear()
        _pattern = None


def secrets() -> frozenset[str]:
    """The registered values (tests)."""
    with _lock:
        return frozenset(_secrets)


def text(value: str) -> str:
    """``value`` with every secret replaced by ``***``."""
    if not isinstance(value, str):
        value = str(value)
    with _lock:
        pattern, whole = _pattern, value in _secrets
    if whole:
        return MASK
    if pattern is not None:
        value = pattern.sub(MASK, value)
    for found, replacement in _PATTERNS:
        value = found.sub(replacement, value)
    return value


def data(value: Any) -> Any:
    """A JSON-like value (dicts, lists, strings…) with :func:`text` applied to every string in it,
    keys too (a secret option's value is one of the registered values, so no key is judged here)."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, Mapping):
        return {data(k) if isinstance(k, str) else k: data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [data(v) for v in value]
    return value


def lines(values: Iterable[str]) -> Iterable[str]:
    """Each line of ``values`` redacted."""
    return (text(v) for v in values)


class LogFilter(logging.Filter):
    """Redacts a record's message (its arguments merged in) and its traceback before any handler
    formats it. Installed on the root logger's handlers and on ``materializer``'s logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: leave it to logging's own report
            return True
        record.msg, record.args = text(message), None
        if record.exc_info:
            formatted = logging.Formatter().formatException(record.exc_info)
            record.exc_text, record.exc_info = text(formatted), None
        elif record.exc_text:
            record.exc_text = text(record.exc_text)
        if record.stack_info:
            record.stack_info = text(record.stack_info)
        return True


class Stream:
    """A text stream (``sys.stdout``, ``sys.stderr``) whose every write is redacted; the rest of
    the stream (``isatty``, ``fileno``, ``buffer``…) is the wrapped one's."""

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def write(self, value: str) -> int:
        if not isinstance(value, str):  # as a text stream does (click probes a stream this way)
            raise TypeError(f"write() argument must be str, not {type(value).__name__}")
        self._wrapped.write(text(value))
        return len(value)

    def writelines(self, values: Iterable[str]) -> None:
        for value in values:
            self.write(value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


_installed = False


def install() -> None:
    """Redact every output of this process (the CLI and the Databricks job call it first): its
    ``sys.stdout`` and ``sys.stderr`` (:class:`Stream`), Python logging (a :class:`LogFilter` on
    the root logger's handlers and on ``materializer``'s logger), uncaught tracebacks
    (``sys.excepthook``, ``threading.excepthook``); and register the environment's AWS secrets."""
    global _installed
    remember_environment()
    if not isinstance(sys.stdout, Stream):
        sys.stdout = Stream(sys.stdout)
    if not isinstance(sys.stderr, Stream):
        sys.stderr = Stream(sys.stderr)
    log_filter = LogFilter()
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, LogFilter) for f in handler.filters):
            handler.addFilter(log_filter)
    for name in ("materializer", "pyspark"):  # (the root's handlers see every other logger's records)
        logger = logging.getLogger(name)
        if not any(isinstance(f, LogFilter) for f in logger.filters):
            logger.addFilter(log_filter)
    if _installed:
        return
    _installed = True
    import traceback

    def excepthook(kind: Any, exc: Any, tb: Any) -> None:
        sys.stderr.write(text("".join(traceback.format_exception(kind, exc, tb))))
        sys.stderr.flush()

    def thread_excepthook(args: Any) -> None:
        if args.exc_type is SystemExit:
            return
        name = getattr(args.thread, "name", "?")
        formatted = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        sys.stderr.write(text(f"Exception in thread {name}:\n{formatted}"))
        sys.stderr.flush()

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
