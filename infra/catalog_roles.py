"""The catalog's roles (infra/catalog-migrate.sh runs this after pgstac's migration): the app's
data identity gets pgstac's ingest role, the STAC API's identity its read role, nothing more.

Run by the server's Microsoft Entra administrator, signed in with libpq's PG* variables (a token
as PGPASSWORD, PGSSLMODE=require). A managed identity becomes a database role through Azure's
``pgaadauth_create_principal(name, is_admin, is_mfa)``, run in the ``postgres`` database: a login
role named after the identity, which signs in with the identity's tokens (Microsoft's "Manage
Microsoft Entra roles in Azure Database for PostgreSQL - Flexible Server"). Neither role is an
administrator: each is then granted one of the roles pgstac's migration defines
(pypgstac migrations/pgstac.<version>.sql: pgstac_read reads and searches; pgstac_ingest is
pgstac_read plus writing items and collections, what loading needs), in the pgstac database.

    python infra/catalog_roles.py DATABASE INGEST_ROLE READ_ROLE [--dry-run]
"""

from __future__ import annotations

import sys

#: pgstac's roles, as its migration creates them.
INGEST = "pgstac_ingest"
READ = "pgstac_read"


def quoted(identifier: str) -> str:
    """An SQL identifier, double-quoted (an identity's name may hold hyphens)."""
    return '"' + identifier.replace('"', '""') + '"'


def principal_statements(roles: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """In the ``postgres`` database: each identity's login role, made once (not an admin, no MFA)."""
    return [
        (
            "SELECT pgaadauth_create_principal(%s, false, false) WHERE NOT EXISTS "
            "(SELECT 1 FROM pg_roles WHERE rolname = %s)",
            (role, role),
        )
        for role in roles
    ]


def grant_statements(ingest_role: str, read_role: str) -> list[str]:
    """In the pgstac database: one pgstac role each, and nothing else."""
    return [f"GRANT {INGEST} TO {quoted(ingest_role)}", f"GRANT {READ} TO {quoted(read_role)}"]


def main(argv: list[str]) -> int:
    dry_run = "--dry-run" in argv
    args = [a for a in argv if a != "--dry-run"]
    if len(args) != 3 or not all(args):
        print(__doc__.rsplit("\n\n", 1)[-1].strip(), file=sys.stderr)
        return 2
    database, ingest_role, read_role = args
    principals, grants = principal_statements([ingest_role, read_role]), grant_statements(ingest_role, read_role)
    if dry_run:
        for statement, values in principals:
            print(f"postgres: {statement} {values}")
        for statement in grants:
            print(f"{database}: {statement}")
        return 0
    import psycopg

    with psycopg.connect(dbname="postgres", autocommit=True) as connection:
        for statement, values in principals:
            connection.execute(statement, values)  # type: ignore[arg-type]
    with psycopg.connect(dbname=database, autocommit=True) as connection:
        for statement in grants:
            connection.execute(statement)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
