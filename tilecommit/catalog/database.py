"""The catalog's database: one connection to pgstac, and the one reading of what its faults mean.

Signing in follows :data:`~tilecommit.settings.SETTING_PGSTAC_AUTH`: ``entra`` (Azure Database
for PostgreSQL with Microsoft Entra authentication: a token of the app's data identity for
:data:`~tilecommit.settings.PGSTAC_ENTRA_SCOPE` is the password, over TLS) or ``trust`` (a local
cluster on 127.0.0.1 that asks for none). No password is ever read from a setting.

A database call ends in one of the answers :mod:`tilecommit.storage_answers` names, told apart
here once (:func:`classify`), by the SQLSTATE class and psycopg's exception family
(PostgreSQL's "Appendix A. PostgreSQL Error Codes"):

| answer | :class:`~tilecommit.storage_answers.Meaning` | retried |
|---|---|---|
| the connection failed or was lost (psycopg's ``OperationalError``, ``InterfaceError``: a server down, shut down by its admin, a reset) | ``no-answer``: a commit in flight has an unknown outcome | yes |
| 40xxx (serialization failure, deadlock: the server rolled the transaction back), 53xxx (insufficient resources, too many connections), 55P03 (lock not available), 57014 (a statement timed out), and an insert that met a concurrent change of pgstac's partitions (:func:`_lost_a_race_with_pgstac_ddl`) | ``busy``: nothing was written; the same request may go through | yes |
| anything else (a syntax or data error, a permission refused, a constraint) | ``refused``: the same request gets the same answer | no |

A unique violation is not a fault but the create-only refusal, which :mod:`.pgstac` reads first.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ..errors import ConfigurationError, StorageFaultError
from ..retries import CONNECTION_TIMEOUT_S, READ_TIMEOUT_S
from ..settings import PGSTAC_AUTH_ENTRA, PGSTAC_ENTRA_SCOPE, Settings
from ..storage_answers import Answer, Meaning, storage_fault

#: SQLSTATE classes and codes of a server that could not serve the request now (the table above).
BUSY_CLASSES = ("40", "53")
BUSY_CODES = ("55P03", "57014")


def connect(settings: Settings, credential: Any = None) -> psycopg.Connection:
    """A new connection to the catalog's database (not in autocommit: the caller commits), with
    pgstac's schema first on the search path, as pgstac's own roles have it. ``credential``: the
    app's data identity, asked for a token when the settings say ``entra``."""
    params: dict[str, Any] = {
        "host": settings.pgstac_host,
        "port": settings.pgstac_port,
        "dbname": settings.pgstac_database,
        "user": settings.pgstac_user,
        "connect_timeout": CONNECTION_TIMEOUT_S,
        "application_name": "tilecommit",
        # A statement that hangs (a lock held by a dead session) ends as a busy answer, retried.
        "options": f"-c search_path=pgstac,public -c statement_timeout={READ_TIMEOUT_S * 1000}",
    }
    if settings.pgstac_auth == PGSTAC_AUTH_ENTRA:
        if credential is None:
            raise ConfigurationError("pgstac: Microsoft Entra authentication needs the app's identity")
        params.update(password=credential.get_token(PGSTAC_ENTRA_SCOPE).token, sslmode="require")
    try:
        return psycopg.connect(**params)
    except psycopg.Error as exc:
        raise database_fault(f"connecting to pgstac at {settings.pgstac_host}:{settings.pgstac_port}", exc) from exc


def _lost_a_race_with_pgstac_ddl(exc: BaseException) -> bool:
    """Whether ``exc`` is an insert that met another's change of pgstac's partitions half-way.

    pgstac's insert trigger makes the collection's partition and widens its time constraint
    (``_items_<key>_dt``, ``check_partition``) before inserting; two inserts at once can make the
    same partition (a unique violation in a system catalog, ``pg_*``) or each set the constraint
    to its own range, so the other's row violates it (23514, seen here with 32 publications at
    once): pgstac's issue 222. Nothing was written; the same insert, sent again, widens it for itself.
    """
    diag = getattr(exc, "diag", None)
    table, constraint = getattr(diag, "table_name", None) or "", getattr(diag, "constraint_name", None) or ""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate == "23505":
        return table.startswith("pg_")
    return sqlstate == "23514" and table.startswith("_items_") and constraint.startswith("_items_")


def classify(exc: BaseException) -> Answer:
    """What a database call's exception says the server answered (the module's table)."""
    reason = f"{type(exc).__name__}: {str(exc).strip()}".splitlines()[0]
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate and (sqlstate[:2] in BUSY_CLASSES or sqlstate in BUSY_CODES or _lost_a_race_with_pgstac_ddl(exc)):
        return Answer(Meaning.BUSY, None, sqlstate, reason)
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) or not isinstance(exc, psycopg.Error):
        return Answer(Meaning.NO_ANSWER, None, sqlstate, reason)
    return Answer(Meaning.REFUSED, None, sqlstate, reason)


def retryable(exc: BaseException) -> bool:
    """Whether the same call may be answered otherwise: no answer, or a busy one."""
    return classify(exc).meaning in (Meaning.NO_ANSWER, Meaning.BUSY)


def database_fault(action: str, exc: BaseException) -> StorageFaultError:
    """The fault for a database call that failed: ``action`` (a verb phrase), the answer in words;
    retried unless the server refused the request itself."""
    answer = classify(exc)
    return storage_fault(
        f"{action} failed: {answer.reason} (sqlstate {answer.code}, {answer.meaning})",
        answer,
        retryable=answer.meaning is not Meaning.REFUSED,
    )
