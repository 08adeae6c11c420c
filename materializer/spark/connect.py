"""Spark Connect sessions, and the apply's session of its own beside a classic or a Connect one."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def remote_session(url: str, conf: dict[str, str] | None = None) -> "SparkSession":
    """A Spark Connect session to ``url`` (``sc://host:port``); the server brings Delta.

    Only SQL settings can be given to a Connect session (the server's own settings are fixed
    when it starts), so ``conf`` keys other than ``spark.sql.*`` / ``spark.databricks.*`` are
    refused rather than silently ignored.
    """
    from materializer import redact
    from materializer.errors import ConfigError

    redact.remember_in(url)  # its ;token=…, whatever prints it next
    shown = redact.text(url)

    # gRPC's fork handlers (on by default) restart its poller thread in a forked child, which
    # can crash the child before it execs when the fork closes the poller's descriptor (grpc
    # issue 43055): a process that used Connect and then starts a process with preexec_fn (a
    # local JVM, PySpark's launcher; the drill's runs) could lose that child. Nothing here uses
    # gRPC in a forked child; read when gRPC starts, so set before the first import. A user's own
    # setting wins.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError as exc:
        raise ConfigError(
            f"--remote {shown}: the Spark Connect client is not installed ({exc}); "
            "install it with `pip install 'delta-materializer[connect]'`"
        ) from None
    fixed = sorted(k for k in (conf or {}) if not k.startswith(("spark.sql.", "spark.databricks.")))
    if fixed:
        raise ConfigError(
            f"spark.conf {fixed} cannot be set from a Spark Connect client: set them where the "
            f"server at {shown} is started"
        )
    # As pyspark's own builder does for a remote session: from now on this process is in Connect
    # mode, so ``functions.col`` & co. build Connect columns (classic ones need a local JVM).
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    session = ConnectSession.builder.remote(url).getOrCreate()
    _close_at_exit(session)
    try:
        # The first call to the server (the client connects lazily): a server that is not there
        # is said here, once, instead of as a gRPC traceback from whatever asks it first.
        session.version
    except Exception as exc:  # noqa: BLE001 - any failure to reach it is the same advice
        from materializer.errors import StartupError

        raise StartupError(
            f"--remote {shown}: the Spark Connect server did not answer ({redact.text(type(exc).__name__)}: "
            f"{redact.text(str(exc).splitlines()[0] if str(exc) else '')[:300]}). Check that it is running and "
            "that the host, port and token are right; nothing was read or written."
        ) from None
    for key, value in (conf or {}).items():
        session.conf.set(key, value)
    return session


def _close_at_exit(session: "SparkSession") -> "SparkSession":
    """Release a Connect session (and close its gRPC channel) when the process exits normally.

    Left to ``SparkSession.__del__`` during interpreter shutdown, closing the channel can wait
    forever in gRPC (measured: ``materializer run --remote`` finished its work, then never exited).
    """
    import atexit

    def close() -> None:
        try:
            session.stop()
        except Exception:  # noqa: BLE001 - a clone lacks some of stop()'s attributes: close it directly
            try:
                session.client.close()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - best effort at exit
                pass

    atexit.register(close)
    return session


def is_connect(spark: "SparkSession") -> bool:
    """Is ``spark`` a Spark Connect session (Databricks serverless / standard access mode)?"""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def isolated_session(spark: "SparkSession") -> "SparkSession":
    """A session sharing ``spark``'s cluster but not its SQL settings, for the session-wide txn confs.

    Classic: ``newSession()`` (same SparkContext, its own SQL conf). Spark Connect has no
    ``newSession`` (it raises ``JVM_ATTRIBUTE_NOT_SUPPORTED``): ``cloneSession()`` (pyspark 4.1+)
    makes a server-side copy over the same connection and credentials. Where neither exists
    (pyspark 4.0's Connect client) the session is shared; that is still safe for our own work,
    because nothing else we run commits to Delta while the txn confs are set (prestaging writes
    plain Parquet, loads only read), but another program's Delta writes in that same session
    would carry our txn id: give the job a session of its own there.
    """
    if not is_connect(spark):
        return spark.newSession()
    clone = getattr(spark, "cloneSession", None)
    if clone is not None:
        try:
            # The server creates a session at its first request, and cannot clone one it has not
            # seen (SESSION_NOT_FOUND): make sure it has.
            spark.conf.get("spark.sql.session.timeZone")
            return _close_at_exit(clone(new_session_id=clone_session_id(spark.session_id, _next_clone(spark.session_id))))
        except Exception:  # noqa: BLE001 - a server without CloneSession (older than 4.1)
            pass
    return spark


CLONES_PER_SESSION = 16
"""How many clones :func:`session_ids_of` names per session (a run makes one per apply thread,
``transaction.parallel_bindings`` of them at most; more than this are still made, with ids of
their own that the drill does not release)."""

_clones: dict[str, int] = {}


def _next_clone(session_id: str) -> int:
    n = _clones.get(session_id, 0)
    _clones[session_id] = n + 1
    return n


def clone_session_id(session_id: str, n: int) -> str:
    """The id of the ``n``-th clone of Connect session ``session_id`` (a UUID derived from it), so
    whoever knows a run's session id knows its clones' too: ``materializer drill --remote``
    releases the sessions of the runs it killed, which their server would otherwise keep (the
    client that would have released them is dead) until its session timeout, 60 minutes by
    default, holding their state: about 200 kills in 45 minutes filled a 1 GB server's heap."""
    import uuid

    if n >= CLONES_PER_SESSION:
        return str(uuid.uuid4())
    return str(uuid.uuid5(uuid.UUID(session_id), f"materializer-clone-{n}"))


def session_ids_of(session_id: str) -> list[str]:
    """Session ``session_id`` and the ids its clones get (:func:`clone_session_id`)."""
    return [session_id, *(clone_session_id(session_id, n) for n in range(CLONES_PER_SESSION))]


def with_session_id(url: str, session_id: str) -> str:
    """Connect URL ``url`` with its session id set to ``session_id`` (any other parameter kept)."""
    base, _, params = url.partition("/;")
    kept = [p for p in params.split(";") if p and not p.startswith("session_id=")]
    return base.rstrip("/") + "/;" + ";".join([*kept, f"session_id={session_id}"])


def release_sessions(url: str, session_ids: list[str]) -> int:
    """Release Connect sessions ``session_ids`` on the server at ``url`` (their running operations
    are interrupted and their state freed); returns how many the server had. An id the server does
    not know, or has closed already, is passed over."""
    from pyspark.sql.connect.client import SparkConnectClient
    from pyspark.sql.connect.proto import base_pb2 as pb2

    released = 0
    for session_id in session_ids:
        client = SparkConnectClient(with_session_id(url, session_id))
        try:
            # The response names the server's session only when the server had one by that id;
            # pyspark's release_session() does not return it, hence its request made here.
            request = pb2.ReleaseSessionRequest(session_id=session_id, client_type=client._builder.userAgent)
            if client._user_id:
                request.user_context.user_id = client._user_id
            response = client._stub.ReleaseSession(request, metadata=client._builder.metadata())
            released += bool(response.server_side_session_id)
        except AttributeError:  # a pyspark whose client is built otherwise: release, uncounted
            try:
                client.release_session()
            except Exception:  # noqa: BLE001 - unknown or closed already: nothing to free
                pass
        except Exception:  # noqa: BLE001 - a server that cannot say: nothing more to free here
            pass
        finally:
            client.close()
    return released
